#include "agent/progress.h"

#include <cstdlib>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdint>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace lifeline::agent {

std::vector<RankProgress> SummarizeProgress(const Timeline& timeline, int node, uint64_t now_ns,
                                            const SampleCursor* after) {
  std::vector<RankProgress> out;
  for (int r = 0; r < timeline.world(); ++r) {
    const RankTimeline& v = timeline.rank(r);
    RankProgress p;
    p.rank = timeline.GlobalRank(r);
    p.node = node;
    p.alive = v.alive;
    p.step = v.step == trace::kNoStep ? -1 : static_cast<int64_t>(v.step);
    p.silent_seconds = v.last_event_ns != 0 && now_ns > v.last_event_ns ? (now_ns - v.last_event_ns) * 1e-9 : 0;
    for (const auto& [comm, seq] : v.last_begun) {
      CommProgress c;
      c.begun = seq;
      const auto open = v.open.find(comm);
      if (open != v.open.end() && !open->second.empty()) {
        const auto& [oldest, o] = *open->second.begin();
        c.open = static_cast<int64_t>(oldest);
        c.posted = o.posted;
        c.op = static_cast<int>(o.op);
        c.open_seconds = now_ns > o.begin_ns ? (now_ns - o.begin_ns) * 1e-9 : 0;
      }
      p.comms[comm] = c;
      // Its newest ended collectives on this communicator.
      const std::map<uint64_t, CollectiveRecord>* records = timeline.Collectives(comm);
      if (records == nullptr) continue;
      uint64_t sent = 0;  // the leader has every ended collective up to this seq
      bool any_sent = false;
      if (after != nullptr) {
        const auto c = after->find({comm, p.rank});
        if (c != after->end()) sent = c->second, any_sent = true;
      }
      std::vector<CollectiveSample> samples;
      for (auto it = records->rbegin(); it != records->rend() && samples.size() < kSamplesPerComm; ++it) {
        if (any_sent && it->first <= sent) break;
        const CollectiveRecord& rec = it->second;
        const size_t i = static_cast<size_t>(r);
        if (i >= rec.end_ns.size() || rec.end_ns[i] == 0 || rec.begin_ns[i] == 0) continue;
        auto ago = [&](uint64_t t) { return now_ns > t ? (now_ns - t) * 1e-9 : 0.0; };
        CollectiveSample s;
        s.comm = comm;
        s.seq = it->first;
        s.op = static_cast<int>(rec.op);
        s.begin_ago = ago(rec.begin_ns[i]);
        s.posted_ago = rec.posted_ns[i] != 0 ? ago(rec.posted_ns[i]) : -1;
        s.end_ago = ago(rec.end_ns[i]);
        samples.push_back(s);
      }
      p.recent.insert(p.recent.end(), samples.rbegin(), samples.rend());
    }
    out.push_back(std::move(p));
  }
  return out;
}

void AdvanceCursor(const std::vector<RankProgress>& ranks, SampleCursor* cursor) {
  for (const RankProgress& p : ranks)
    for (const CollectiveSample& s : p.recent) {
      const auto [it, fresh] = cursor->try_emplace({s.comm, p.rank}, s.seq);
      if (!fresh) it->second = std::max(it->second, s.seq);
    }
}

int64_t UnixMillisNow() {
  // LIFELINE_TEST_CLOCK_OFFSET_MS shifts this agent's wall clock, as a node whose clock is off
  // would have it (the skew tests; read once).
  static const int64_t offset = [] {
    const char* v = std::getenv("LIFELINE_TEST_CLOCK_OFFSET_MS");
    return v != nullptr ? std::strtoll(v, nullptr, 10) : int64_t{0};
  }();
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
             .count() +
         offset;
}

std::string EncodeProgressJson(const std::vector<RankProgress>& ranks, int64_t unix_ms) {
  nlohmann::json out = nlohmann::json::array();
  for (const RankProgress& p : ranks) {
    nlohmann::json comms = nlohmann::json::object();
    for (const auto& [comm, c] : p.comms)
      comms[std::to_string(comm)] = {c.begun, c.open, c.posted ? 1 : 0, c.op, static_cast<int64_t>(c.open_seconds * 1000)};
    nlohmann::json recent = nlohmann::json::array();
    auto us = [](double s) { return s < 0 ? int64_t{-1} : static_cast<int64_t>(s * 1e6); };
    for (const CollectiveSample& s : p.recent)
      recent.push_back({s.comm, s.seq, s.op, us(s.begin_ago), us(s.posted_ago), us(s.end_ago)});
    out.push_back(
        {p.rank, p.node, p.alive ? 1 : 0, p.step, static_cast<int64_t>(p.silent_seconds * 1000), comms, recent});
  }
  return nlohmann::json({{"t", unix_ms}, {"r", out}}).dump();
}

namespace {

// A value outside what EncodeProgress writes (formats/SPEC.md §17); thrown by the readers below and
// caught with nlohmann's own exceptions.
struct Refused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Times and ages: at most 2^50 in their unit (ms or µs: 35 years in µs), so that no later sum,
// product or conversion to nanoseconds leaves its type.
constexpr int64_t kMaxTime = int64_t{1} << 50;

// The integer `j` (JSON's integers only: not a fraction, not a boolean), within [lo, hi].
int64_t Int(const nlohmann::json& j, int64_t lo, int64_t hi, const char* field) {
  if (!j.is_number_integer()) throw Refused(std::string(field) + " is not an integer");
  if (j.is_number_unsigned() ? j.get<uint64_t>() > static_cast<uint64_t>(hi)
                             : j.get<int64_t>() < lo || j.get<int64_t>() > hi)
    throw Refused(std::string(field) + " " + j.dump() + " is out of range");
  return j.get<int64_t>();
}

uint64_t Unsigned(const nlohmann::json& j, const char* field) {
  if (!j.is_number_unsigned()) throw Refused(std::string(field) + " is not an unsigned integer");
  return j.get<uint64_t>();
}

const nlohmann::json& Array(const nlohmann::json& j, size_t min_size, const char* field) {
  if (!j.is_array() || j.size() < min_size) throw Refused(std::string(field) + " is not an array of " +
                                                          std::to_string(min_size) + " or more");
  return j;
}

// A communicator id as the encoder spells it: decimal, no sign, no leading zero, within uint32.
uint32_t CommId(const std::string& key) {
  uint32_t id = 0;
  const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
  if (ec != std::errc() || end != key.data() + key.size() || key != std::to_string(id))
    throw Refused("communicator id \"" + key.substr(0, 32) + "\"");
  return id;
}

}  // namespace

namespace {

// The JSON summary of §17.1, ages as written (no transit).
Result<SummaryFrame> DecodeJson(std::string_view text, const std::string& what) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Corruption(what, "not a progress summary of lifeline-agent");
  SummaryFrame frame;
  std::vector<RankProgress>& out = frame.ranks;
  try {
    frame.unix_ms = Int(j.at("t"), 0, kMaxTime, "t");
    constexpr double transit = 0;
    for (const nlohmann::json& r : Array(j.at("r"), 0, "r")) {
      Array(r, 6, "a rank");
      RankProgress p;
      p.rank = static_cast<int>(Int(r[0], 0, INT32_MAX, "rank"));
      p.node = static_cast<int>(Int(r[1], 0, INT32_MAX, "node"));
      p.alive = Int(r[2], 0, 1, "alive") != 0;
      p.step = std::max<int64_t>(-1, Int(r[3], INT64_MIN, INT64_MAX, "step"));  // negative: none
      p.silent_seconds = static_cast<double>(Int(r[4], 0, kMaxTime, "silent_ms")) * 1e-3 + transit;
      p.summary_age_seconds = transit;
      if (!r[5].is_object()) throw Refused("communicators are not an object");
      for (const auto& [comm, c] : r[5].items()) {
        Array(c, 4, "a communicator");
        CommProgress cp;
        cp.begun = Unsigned(c[0], "begun");
        cp.open = std::max<int64_t>(-1, Int(c[1], INT64_MIN, INT64_MAX, "open"));  // negative: none
        cp.posted = Int(c[2], 0, 1, "posted") != 0;
        cp.op = static_cast<int>(Int(c[3], 0, UINT16_MAX, "op"));
        cp.open_seconds = cp.open >= 0 ? static_cast<double>(Int(c.at(4), 0, kMaxTime, "open_ms")) * 1e-3 + transit : 0;
        p.comms[CommId(comm)] = cp;
      }
      if (r.size() > 6) {
        for (const nlohmann::json& x : Array(r[6], 0, "recent")) {
          Array(x, 6, "a collective");
          CollectiveSample s;
          s.comm = static_cast<uint32_t>(Int(x[0], 0, UINT32_MAX, "comm"));
          s.seq = Unsigned(x[1], "seq");
          s.op = static_cast<int>(Int(x[2], 0, UINT16_MAX, "op"));
          s.begin_ago = static_cast<double>(Int(x[3], 0, kMaxTime, "begin_us")) * 1e-6 + transit;
          const int64_t posted = Int(x[4], -1, kMaxTime, "posted_us");
          s.posted_ago = posted < 0 ? -1 : static_cast<double>(posted) * 1e-6 + transit;
          s.end_ago = static_cast<double>(Int(x[5], 0, kMaxTime, "end_us")) * 1e-6 + transit;
          p.recent.push_back(s);
        }
      }
      out.push_back(std::move(p));
    }
  } catch (const std::exception& e) {
    return Status::Corruption(what, std::string("not a progress summary of lifeline-agent: ") + e.what());
  }
  return frame;
}


// The binary summary (§17): LEB128 varints, zigzag for the signed ones.
constexpr char kMagic[4] = {'L', 'L', 'S', '\x02'};
constexpr char kMagicDigests[4] = {'L', 'L', 'S', '\x03'};  // version 3: a digest section after the ranks
constexpr size_t kMaxDigestName = 4096;  // trace::kMaxReplicaNameParts x kReplicaNamePartBytes, rounded
constexpr size_t kMaxScalarName = 256;

bool HasMagic(std::string_view bytes) {
  if (bytes.size() < sizeof(kMagic)) return false;
  const std::string_view head = bytes.substr(0, sizeof(kMagic));
  return head == std::string_view(kMagic, sizeof(kMagic)) || head == std::string_view(kMagicDigests, sizeof(kMagic));
}

void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

uint64_t ZigZag(int64_t v) { return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63); }
int64_t UnZigZag(uint64_t v) { return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1); }

// Microseconds or milliseconds of an age, as written: never negative, at most kMaxTime.
uint64_t Units(double seconds, double per_second) {
  const double v = seconds * per_second;
  if (!(v > 0)) return 0;
  return v >= static_cast<double>(kMaxTime) ? static_cast<uint64_t>(kMaxTime) : static_cast<uint64_t>(v);
}

class WireReader {
 public:
  explicit WireReader(std::string_view bytes) : p_(bytes) {}
  uint64_t Varint(const char* field) {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      if (p_.empty()) throw Refused(std::string(field) + " runs past the end");
      const uint8_t b = static_cast<uint8_t>(p_[0]);
      p_.remove_prefix(1);
      if (shift == 63 && b > 1) throw Refused(std::string(field) + " is not a 64-bit varint");
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
      if (shift == 63) throw Refused(std::string(field) + " is not a 64-bit varint");
    }
  }
  uint64_t Upto(uint64_t hi, const char* field) {
    const uint64_t v = Varint(field);
    if (v > hi) throw Refused(std::string(field) + " " + std::to_string(v) + " is out of range");
    return v;
  }
  // A count of entries each at least `min_bytes` long: no more than the bytes left can hold.
  size_t Count(size_t min_bytes, const char* field) {
    const uint64_t n = Varint(field);
    if (n > p_.size() / min_bytes) throw Refused(std::string(field) + " " + std::to_string(n) + " exceeds the bytes left");
    return static_cast<size_t>(n);
  }
  uint64_t U64(const char* field) {
    if (p_.size() < 8) throw Refused(std::string(field) + " runs past the end");
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p_[i])) << (8 * i);
    p_.remove_prefix(8);
    return v;
  }
  std::string Bytes(size_t n, const char* field) {
    if (p_.size() < n) throw Refused(std::string(field) + " runs past the end");
    std::string v(p_.substr(0, n));
    p_.remove_prefix(n);
    return v;
  }
  bool done() const { return p_.empty(); }

 private:
  std::string_view p_;
};

SummaryFrame DecodeBinary(std::string_view bytes) {
  WireReader in(bytes.substr(sizeof(kMagic)));
  SummaryFrame frame;
  frame.number = in.Varint("number");
  frame.base = in.Varint("base");
  frame.unix_ms = static_cast<int64_t>(in.Upto(kMaxTime, "t"));
  const size_t ranks = in.Count(7, "ranks");
  frame.ranks.reserve(ranks);
  for (size_t k = 0; k < ranks; ++k) {
    RankProgress p;
    p.rank = static_cast<int>(in.Upto(INT32_MAX, "rank"));
    p.node = static_cast<int>(in.Upto(INT32_MAX, "node"));
    p.alive = in.Upto(1, "alive") != 0;
    p.step = std::max<int64_t>(-1, UnZigZag(in.Varint("step")));
    p.silent_seconds = static_cast<double>(in.Upto(kMaxTime, "silent_ms")) * 1e-3;
    const size_t comms = in.Count(6, "communicators");
    for (size_t c = 0; c < comms; ++c) {
      const uint32_t id = static_cast<uint32_t>(in.Upto(UINT32_MAX, "communicator id"));
      CommProgress cp;
      cp.begun = in.Varint("begun");
      cp.open = std::max<int64_t>(-1, UnZigZag(in.Varint("open")));
      cp.posted = in.Upto(1, "posted") != 0;
      cp.op = static_cast<int>(in.Upto(UINT16_MAX, "op"));
      const double open_ms = static_cast<double>(in.Upto(kMaxTime, "open_ms"));
      cp.open_seconds = cp.open >= 0 ? open_ms * 1e-3 : 0;
      p.comms[id] = cp;
    }
    const size_t samples = in.Count(6, "collectives");
    p.recent.reserve(samples);
    uint64_t seq = 0;
    for (size_t c = 0; c < samples; ++c) {
      CollectiveSample x;
      x.comm = static_cast<uint32_t>(in.Upto(UINT32_MAX, "comm"));
      seq += in.Varint("seq");  // the difference to the one before, modulo 2^64
      x.seq = seq;
      x.op = static_cast<int>(in.Upto(UINT16_MAX, "op"));
      const int64_t begin = static_cast<int64_t>(in.Upto(kMaxTime, "begin_us"));
      // Posted and ended: how long after it began, in µs (zigzag; the post's plus 1, 0: none).
      auto after_begin = [&](uint64_t zigzag, const char* field) {
        const int64_t d = UnZigZag(zigzag);
        if (d < -kMaxTime || d > kMaxTime || begin - d < 0 || begin - d > kMaxTime)
          throw Refused(std::string(field) + " is out of range");
        return static_cast<double>(begin - d) * 1e-6;
      };
      x.begin_ago = static_cast<double>(begin) * 1e-6;
      const uint64_t posted = in.Varint("posted_us");
      x.posted_ago = posted == 0 ? -1 : after_begin(posted - 1, "posted_us");
      x.end_ago = after_begin(in.Varint("end_us"), "end_us");
      p.recent.push_back(x);
    }
    frame.ranks.push_back(std::move(p));
  }
  if (bytes[3] == kMagicDigests[3]) {
    const size_t folds = in.Count(20, "folds");
    frame.folds.reserve(folds);
    for (size_t k = 0; k < folds; ++k) {
      DigestFold f;
      f.rank = static_cast<int>(in.Upto(INT32_MAX, "fold rank"));
      f.step = in.Varint("fold step");
      f.keyset = in.U64("keyset");
      f.digest = in.U64("digest");
      f.shards = static_cast<uint32_t>(in.Upto(UINT32_MAX, "shards"));
      f.expect = static_cast<uint32_t>(in.Upto(UINT32_MAX, "expect"));
      if (f.shards == 0 || f.expect < 2) throw Refused("a fold of no shard, or of shards with fewer than 2 replicas");
      frame.folds.push_back(f);
    }
    const size_t details = in.Count(3, "details");
    frame.details.reserve(details);
    for (size_t k = 0; k < details; ++k) {
      DigestDetail d;
      d.rank = static_cast<int>(in.Upto(INT32_MAX, "detail rank"));
      d.step = in.Varint("detail step");
      const size_t shards = in.Count(20, "detail shards");
      d.shards.reserve(shards);
      for (size_t j = 0; j < shards; ++j) {
        ShardDigestEntry e;
        e.key = in.U64("key");
        e.digest = in.U64("shard digest");
        e.replicas = static_cast<uint32_t>(in.Upto(UINT32_MAX, "replicas"));
        if (e.replicas < 2) throw Refused("a shard of fewer than 2 replicas");
        e.bytes = in.Varint("bytes");
        const uint64_t offset = in.Varint("offset");
        e.tensor_offset = offset == 0 ? trace::kNoOffset : offset - 1;
        e.name = in.Bytes(static_cast<size_t>(in.Upto(kMaxDigestName, "name length")), "name");
        d.shards.push_back(std::move(e));
      }
      frame.details.push_back(std::move(d));
    }
    const size_t values = in.Count(5, "values");
    frame.values.reserve(values);
    for (size_t k = 0; k < values; ++k) {
      ValueReport v;
      const size_t length = static_cast<size_t>(in.Upto(kMaxScalarName, "scalar length"));
      if (length == 0) throw Refused("a value of a scalar with no name");
      v.scalar = in.Bytes(length, "scalar");
      v.group = static_cast<int>(in.Upto(INT32_MAX, "group"));
      v.step = in.Varint("value step");
      const size_t ranks = in.Count(9, "value ranks");
      v.bits.reserve(ranks);
      for (size_t j = 0; j < ranks; ++j) {
        const int rank = static_cast<int>(in.Upto(INT32_MAX, "value rank"));
        v.bits.emplace_back(rank, in.U64("bits"));
      }
      frame.values.push_back(std::move(v));
    }
  }
  if (!in.done()) throw Refused(bytes[3] == kMagicDigests[3] ? "bytes after the last value report" : "bytes after the last rank");
  return frame;
}

// Every age of rank `p` older by `seconds`, the summary's own too.
void Age(RankProgress& p, double seconds) {
  p.silent_seconds += seconds;
  p.summary_age_seconds += seconds;
  for (auto& [comm, c] : p.comms)
    if (c.open >= 0) c.open_seconds += seconds;
  for (CollectiveSample& s : p.recent) {
    s.begin_ago += seconds;
    s.end_ago += seconds;
    if (s.posted_ago >= 0) s.posted_ago += seconds;
  }
}

void Age(std::vector<RankProgress>* ranks, double seconds) {
  if (seconds <= 0) return;
  for (RankProgress& p : *ranks) Age(p, seconds);
}

double Transit(int64_t written_ms, int64_t now_ms) {
  return now_ms > written_ms ? static_cast<double>(now_ms - written_ms) * 1e-3 : 0;
}

}  // namespace

std::string EncodeProgress(const std::vector<RankProgress>& ranks, int64_t unix_ms, uint64_t number, uint64_t base) {
  SummaryFrame frame;
  frame.number = number;
  frame.base = base;
  frame.unix_ms = unix_ms;
  frame.ranks = ranks;
  return EncodeSummary(frame);
}

std::string EncodeSummary(const SummaryFrame& frame) {
  const std::vector<RankProgress>& ranks = frame.ranks;
  const int64_t unix_ms = frame.unix_ms;
  const uint64_t number = frame.number, base = frame.base;
  const std::vector<DigestFold>& folds = frame.folds;
  const std::vector<DigestDetail>& details = frame.details;
  const bool digests = !folds.empty() || !details.empty() || !frame.values.empty();
  std::string out(digests ? kMagicDigests : kMagic, sizeof(kMagic));
  out.reserve(32 + ranks.size() * 64);
  PutVarint(&out, number);
  PutVarint(&out, base);
  PutVarint(&out, static_cast<uint64_t>(std::clamp<int64_t>(unix_ms, 0, kMaxTime)));
  PutVarint(&out, ranks.size());
  for (const RankProgress& p : ranks) {
    PutVarint(&out, static_cast<uint64_t>(std::max(0, p.rank)));
    PutVarint(&out, static_cast<uint64_t>(std::max(0, p.node)));
    out.push_back(p.alive ? 1 : 0);
    PutVarint(&out, ZigZag(std::max<int64_t>(-1, p.step)));
    PutVarint(&out, Units(p.silent_seconds, 1e3));
    PutVarint(&out, p.comms.size());
    for (const auto& [comm, c] : p.comms) {
      PutVarint(&out, comm);
      PutVarint(&out, c.begun);
      PutVarint(&out, ZigZag(std::max<int64_t>(-1, c.open)));
      out.push_back(c.posted ? 1 : 0);
      PutVarint(&out, static_cast<uint64_t>(std::clamp(c.op, 0, 65535)));
      PutVarint(&out, c.open >= 0 ? Units(c.open_seconds, 1e3) : 0);
    }
    PutVarint(&out, p.recent.size());
    uint64_t seq = 0;
    for (const CollectiveSample& s : p.recent) {
      PutVarint(&out, s.comm);
      PutVarint(&out, s.seq - seq);
      seq = s.seq;
      PutVarint(&out, static_cast<uint64_t>(std::clamp(s.op, 0, 65535)));
      const int64_t begin = static_cast<int64_t>(Units(s.begin_ago, 1e6));
      PutVarint(&out, static_cast<uint64_t>(begin));
      PutVarint(&out, s.posted_ago < 0 ? 0 : ZigZag(begin - static_cast<int64_t>(Units(s.posted_ago, 1e6))) + 1);
      PutVarint(&out, ZigZag(begin - static_cast<int64_t>(Units(s.end_ago, 1e6))));
    }
  }
  if (!digests) return out;
  PutVarint(&out, folds.size());
  for (const DigestFold& f : folds) {
    PutVarint(&out, static_cast<uint64_t>(std::max(0, f.rank)));
    PutVarint(&out, f.step);
    PutU64(&out, f.keyset);
    PutU64(&out, f.digest);
    PutVarint(&out, std::max<uint32_t>(f.shards, 1));
    PutVarint(&out, std::max<uint32_t>(f.expect, 2));
  }
  PutVarint(&out, details.size());
  for (const DigestDetail& d : details) {
    PutVarint(&out, static_cast<uint64_t>(std::max(0, d.rank)));
    PutVarint(&out, d.step);
    PutVarint(&out, d.shards.size());
    for (const ShardDigestEntry& e : d.shards) {
      PutU64(&out, e.key);
      PutU64(&out, e.digest);
      PutVarint(&out, std::max<uint32_t>(e.replicas, 2));
      PutVarint(&out, e.bytes);
      PutVarint(&out, e.tensor_offset == trace::kNoOffset ? 0 : e.tensor_offset + 1);
      const std::string_view name = std::string_view(e.name).substr(0, kMaxDigestName);
      PutVarint(&out, name.size());
      out.append(name);
    }
  }
  PutVarint(&out, frame.values.size());
  for (const ValueReport& v : frame.values) {
    const std::string_view scalar = std::string_view(v.scalar).substr(0, kMaxScalarName);
    PutVarint(&out, scalar.size());
    out.append(scalar);
    PutVarint(&out, static_cast<uint64_t>(std::max(0, v.group)));
    PutVarint(&out, v.step);
    PutVarint(&out, v.bits.size());
    for (const auto& [rank, bits] : v.bits) {
      PutVarint(&out, static_cast<uint64_t>(std::max(0, rank)));
      PutU64(&out, bits);
    }
  }
  return out;
}

uint64_t SummaryNumber(std::string_view bytes, uint64_t* base) {
  if (base != nullptr) *base = 0;
  if (bytes.size() <= sizeof(kMagic) || !HasMagic(bytes)) return 0;
  try {
    WireReader in(bytes.substr(sizeof(kMagic)));
    const uint64_t number = in.Varint("number");
    const uint64_t follows = in.Varint("base");
    if (base != nullptr) *base = follows;
    return number;
  } catch (const Refused&) {
    return 0;
  }
}

Result<SummaryFrame> DecodeSummary(std::string_view bytes, const std::string& what, int64_t now_unix_ms) {
  Result<SummaryFrame> frame = Status::Corruption(what, "not a progress summary of lifeline-agent");
  if (HasMagic(bytes)) {
    try {
      frame = DecodeBinary(bytes);
    } catch (const std::exception& e) {
      return Status::Corruption(what, std::string("not a progress summary of lifeline-agent: ") + e.what());
    }
  } else {
    frame = DecodeJson(bytes, what);
  }
  if (frame.ok()) Age(&frame->ranks, Transit(frame->unix_ms, now_unix_ms));
  return frame;
}

Result<std::vector<RankProgress>> DecodeProgress(std::string_view bytes, const std::string& what, int64_t now_unix_ms) {
  LL_ASSIGN_OR_RETURN(SummaryFrame frame, DecodeSummary(bytes, what, now_unix_ms));
  return std::move(frame.ranks);
}

void SummaryMerger::Merge(const std::string& node, SummaryFrame frame, int64_t read_unix_ms) {
  Node& n = nodes_[node];
  if (frame.base != 0 && frame.number != 0 && frame.number <= n.number) return;  // had it already
  if (frame.base == 0 || n.ranks.empty()) {
    if (frame.base != 0) ++gaps_;
    n.number = frame.number;
    n.read_unix_ms = read_unix_ms;
    n.ranks = std::move(frame.ranks);
    return;
  }
  if (frame.base > n.number) ++gaps_;  // the summaries between were not merged: their collectives are missed
  // What the node held, aged to this read; each rank's window extended by the new collectives.
  Age(&n.ranks, Transit(n.read_unix_ms, read_unix_ms));
  std::map<int, std::vector<CollectiveSample>*> held;
  for (RankProgress& p : n.ranks) held[p.rank] = &p.recent;
  for (RankProgress& p : frame.ranks) {
    const auto it = held.find(p.rank);
    if (it == held.end()) continue;
    std::vector<CollectiveSample>& old = *it->second;
    // Per communicator, oldest first: the old window, then what is newer; the newest kSamplesPerComm.
    std::map<uint32_t, std::vector<CollectiveSample>> by_comm;
    for (const CollectiveSample& s : old) by_comm[s.comm].push_back(s);
    for (const CollectiveSample& s : p.recent) {
      std::vector<CollectiveSample>& w = by_comm[s.comm];
      if (w.empty() || s.seq > w.back().seq) w.push_back(s);
    }
    std::vector<CollectiveSample> merged;
    for (auto& [comm, w] : by_comm) {
      const size_t from = w.size() > kSamplesPerComm ? w.size() - kSamplesPerComm : 0;
      merged.insert(merged.end(), w.begin() + static_cast<std::ptrdiff_t>(from), w.end());
    }
    p.recent = std::move(merged);
  }
  n.number = frame.number;
  n.read_unix_ms = read_unix_ms;
  n.ranks = std::move(frame.ranks);
}

void SummaryMerger::View(int64_t now_unix_ms, std::vector<RankProgress>* out) const {
  out->clear();
  for (const auto& [node, n] : nodes_) {
    const size_t from = out->size();
    out->insert(out->end(), n.ranks.begin(), n.ranks.end());
    const double later = Transit(n.read_unix_ms, now_unix_ms);
    if (later > 0)
      for (size_t k = from; k < out->size(); ++k) Age((*out)[k], later);
  }
}

}  // namespace lifeline::agent
