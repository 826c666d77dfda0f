#include "formats/safetensors.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <new>
#include <nlohmann/json.hpp>

#include "formats/geometry.h"
#include "formats/index_codec.h"
#include <unordered_set>

namespace lifeline::format {
namespace {

using Json = nlohmann::json;

// ---- dtypes ----

struct DTypeName {
  DType type;
  std::string_view name;
};

constexpr std::array<DTypeName, 12> kSupportedDTypes = {{
    {DType::kF64, "F64"},
    {DType::kF32, "F32"},
    {DType::kF16, "F16"},
    {DType::kBF16, "BF16"},
    {DType::kF8E4M3, "F8_E4M3"},
    {DType::kF8E5M2, "F8_E5M2"},
    {DType::kI64, "I64"},
    {DType::kI32, "I32"},
    {DType::kI16, "I16"},
    {DType::kI8, "I8"},
    {DType::kU8, "U8"},
    {DType::kBool, "BOOL"},
}};

// Published by the reference implementation but without a Lifeline DType.
constexpr std::array<std::string_view, 10> kUnsupportedPublishedDTypes = {
    "U16", "U32", "U64", "C64", "F4", "F6_E2M3", "F6_E3M2", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"};

// ---- text helpers ----


std::string TensorLabel(std::string_view name) { return "tensor " + QuoteUntrusted(name); }


std::string RangeText(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    const uint32_t min_cp = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
    if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

// Appends `s` as a JSON string. REQUIRES: IsValidUtf8(s) (bytes >= 0x80 are copied as they are).
void AppendJsonString(std::string* out, std::string_view s) {
  out->push_back('"');
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          *out += buf;
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

// Why a tensor name is outside what Lifeline represents; empty when it is fine.
std::string TensorNameProblem(std::string_view name) {
  if (name.empty()) return "empty tensor name";
  if (name.size() > kMaxNameBytes)
    return TensorLabel(name) + ": name of " + std::to_string(name.size()) + " bytes exceeds " +
           std::to_string(kMaxNameBytes);
  if (name.find('\0') != std::string_view::npos) return TensorLabel(name) + ": name contains a NUL byte";
  return {};
}

// ---- validation of entries (shared by the reader and the writer) ----

// Checks one entry in isolation against a data buffer of `data_bytes`. `fail` makes the status
// (Corruption for files, InvalidArgument for callers).
template <typename Fail>
Status CheckEntryBytes(const SafetensorsEntry& e, uint64_t data_bytes, std::string_view dtype_name,
                       const Fail& fail) {
  const std::string who = TensorLabel(e.name);
  if (e.shape.size() > kMaxRank)
    return fail(who + ": shape has " + std::to_string(e.shape.size()) + " dimensions, more than " +
                std::to_string(kMaxRank));
  // Element count in int64, as the reference reader's checked fold: an overflow is an error even
  // when a later extent is 0.
  uint64_t elements = 1;
  for (int64_t d : e.shape) {
    if (d < 0) return fail(who + ": shape " + ShapeString(e.shape) + " has a negative dimension");
    const uint64_t ud = static_cast<uint64_t>(d);
    if (elements != 0 && ud > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / elements)
      return fail(who + ": shape " + ShapeString(e.shape) + " has more than 2^63-1 elements");
    elements *= ud;
  }
  const uint64_t size = DTypeSize(e.dtype);
  if (size == 0) return fail(who + ": invalid dtype code " + std::to_string(static_cast<int>(e.dtype)));
  if (elements > std::numeric_limits<uint64_t>::max() / size)
    return fail(who + ": shape " + ShapeString(e.shape) + " of " + std::string(dtype_name) +
                " needs more than 2^64-1 bytes");
  const uint64_t bytes = elements * size;
  if (e.begin > e.end)
    return fail(who + ": data_offsets " + RangeText(e.begin, e.end) + " begin after they end");
  if (e.end > data_bytes)
    return fail(who + ": data_offsets " + RangeText(e.begin, e.end) + " run past the end of the data buffer (" +
                std::to_string(data_bytes) + " bytes)");
  if (e.end - e.begin != bytes)
    return fail(who + ": dtype/size mismatch: shape " + ShapeString(e.shape) + " of " + std::string(dtype_name) +
                " needs " + std::to_string(bytes) + " bytes but data_offsets " + RangeText(e.begin, e.end) +
                " hold " + std::to_string(e.end - e.begin));
  return Status::OK();
}

// Sorts by (begin, end), keeping the given order among equals, and rejects two tensors of
// non-zero length that share a byte.
template <typename Fail>
Status SortAndCheckOverlap(std::vector<SafetensorsEntry>* entries, const Fail& fail) {
  std::stable_sort(entries->begin(), entries->end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const SafetensorsEntry* reach = nullptr;  // the non-empty tensor that ends last so far
  for (const SafetensorsEntry& e : *entries) {
    if (e.begin == e.end) continue;
    if (reach != nullptr && e.begin < reach->end)
      return fail(TensorLabel(reach->name) + " " + RangeText(reach->begin, reach->end) + " and " + TensorLabel(e.name) +
                  " " + RangeText(e.begin, e.end) + " overlap");
    if (reach == nullptr || e.end > reach->end) reach = &e;
  }
  return Status::OK();
}

// ---- streaming JSON parsing ----

// A SAX consumer that rejects every event its subclass does not expect. Subclasses record the
// first error in `error_`; a JSON syntax error is recorded by parse_error.
class StrictSax {
 public:
  explicit StrictSax(std::string_view file) : file_(file) {}
  virtual ~StrictSax() = default;

  const Status& error() const { return error_; }

  virtual bool null() { return Unexpected("null"); }
  virtual bool boolean(bool) { return Unexpected("a boolean"); }
  virtual bool number_integer(Json::number_integer_t) { return Unexpected("a number"); }
  virtual bool number_unsigned(Json::number_unsigned_t) { return Unexpected("a number"); }
  virtual bool number_float(Json::number_float_t, const Json::string_t&) { return Unexpected("a number"); }
  virtual bool string(Json::string_t&) { return Unexpected("a string"); }
  bool binary(Json::binary_t&) { return Unexpected("binary data"); }
  virtual bool start_object(std::size_t) { return Unexpected("an object"); }
  virtual bool key(Json::string_t&) { return Unexpected("a key"); }
  virtual bool end_object() { return Unexpected("the end of an object"); }
  virtual bool start_array(std::size_t) { return Unexpected("an array"); }
  virtual bool end_array() { return Unexpected("the end of an array"); }

  bool parse_error(std::size_t position, const std::string& /*last_token*/, const nlohmann::detail::exception& ex) {
    if (error_.ok()) {
      std::string what = ex.what();
      // Drop nlohmann's "[json.exception.parse_error.101] " prefix.
      if (const size_t close = what.find("] "); !what.empty() && what[0] == '[' && close != std::string::npos)
        what.erase(0, close + 2);
      error_ = Status::Corruption(file_, "invalid JSON at byte " + std::to_string(position) + Where() + ": " + what);
    }
    return false;
  }

 protected:
  // Describes what was expected where `found` arrived.
  virtual bool Unexpected(std::string_view found) = 0;
  // " in the entry of tensor 'x'" or similar, for syntax errors; may be empty.
  virtual std::string Where() const { return {}; }

  bool Fail(Status s) {
    if (error_.ok()) error_ = std::move(s);
    return false;
  }
  bool Corrupt(const std::string& msg) { return Fail(Status::Corruption(file_, msg)); }

  std::string file_;
  Status error_;
};

// Runs `sax` over `text`; returns its error, or a generic one if parsing stopped without one.
Status RunSax(std::string_view text, StrictSax* sax, std::string_view file) {
  // nlohmann's lexer takes a NUL byte for the end of input and would ignore what follows; a raw
  // NUL is never valid JSON, so refuse it up front.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    return Status::Corruption(file, "invalid JSON: NUL byte at byte " + std::to_string(nul));
  bool ok = false;
  try {
    ok = Json::sax_parse(text.begin(), text.end(), sax);
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted(file, "out of memory while parsing JSON");
  } catch (const std::exception& ex) {
    return Status::Corruption(file, std::string("invalid JSON: ") + ex.what());
  }
  if (!sax->error().ok()) return sax->error();
  if (!ok) return Status::Corruption(file, "invalid JSON");
  return Status::OK();
}

// The raw content of one header entry, before semantic checks.
struct RawEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint64_t> offsets;
  bool has_dtype = false, has_shape = false, has_offsets = false;
};

constexpr std::string_view kMetadataKey = "__metadata__";

class HeaderSax final : public StrictSax {
 public:
  explicit HeaderSax(std::string_view file) : StrictSax(file) {}

  std::vector<RawEntry>& entries() { return entries_; }
  std::map<std::string, std::string>& metadata() { return metadata_; }

  bool start_object(std::size_t) override {
    switch (state_) {
      case State::kStart: state_ = State::kTop; return true;
      case State::kTopValue:
        if (key_ == kMetadataKey) {
          state_ = State::kMetadata;
        } else {
          entries_.emplace_back();
          entries_.back().name = key_;
          state_ = State::kEntry;
        }
        return true;
      default: return Unexpected("an object");
    }
  }

  bool key(Json::string_t& k) override {
    switch (state_) {
      case State::kTop:
        if (!top_keys_.insert(k).second)
          return Corrupt(k == kMetadataKey ? "duplicate key '__metadata__'" : TensorLabel(k) + " appears twice in the header");
        key_ = std::move(k);
        state_ = State::kTopValue;
        return true;
      case State::kMetadata:
        if (metadata_.count(k)) return Corrupt("__metadata__: duplicate key " + QuoteUntrusted(k));
        key_ = std::move(k);
        state_ = State::kMetadataValue;
        return true;
      case State::kEntry: {
        RawEntry& e = entries_.back();
        bool* seen = k == "dtype" ? &e.has_dtype : k == "shape" ? &e.has_shape : k == "data_offsets" ? &e.has_offsets : nullptr;
        if (seen == nullptr)
          return Corrupt(TensorLabel(e.name) + ": unexpected key " + QuoteUntrusted(k) + " (allowed: dtype, shape, data_offsets)");
        if (*seen) return Corrupt(TensorLabel(e.name) + ": duplicate key " + QuoteUntrusted(k));
        *seen = true;
        field_ = k == "dtype" ? Field::kDType : k == "shape" ? Field::kShape : Field::kOffsets;
        state_ = State::kEntryValue;
        return true;
      }
      default: return Unexpected("a key");
    }
  }

  bool end_object() override {
    switch (state_) {
      case State::kTop: state_ = State::kDone; return true;
      case State::kMetadata: state_ = State::kTop; return true;
      case State::kEntry: {
        const RawEntry& e = entries_.back();
        const char* missing = !e.has_dtype ? "dtype" : !e.has_shape ? "shape" : !e.has_offsets ? "data_offsets" : nullptr;
        if (missing) return Corrupt(TensorLabel(e.name) + ": missing key '" + missing + "'");
        state_ = State::kTop;
        return true;
      }
      default: return Unexpected("the end of an object");
    }
  }

  bool start_array(std::size_t) override {
    if (state_ == State::kEntryValue && field_ != Field::kDType) {
      state_ = field_ == Field::kShape ? State::kShape : State::kOffsets;
      return true;
    }
    return Unexpected("an array");
  }

  bool end_array() override {
    if (state_ == State::kShape) {
      state_ = State::kEntry;
      return true;
    }
    if (state_ == State::kOffsets) {
      const RawEntry& e = entries_.back();
      if (e.offsets.size() != 2)
        return Corrupt(TensorLabel(e.name) + ": data_offsets has " + std::to_string(e.offsets.size()) +
                       " values, not 2 (begin, end)");
      state_ = State::kEntry;
      return true;
    }
    return Unexpected("the end of an array");
  }

  bool string(Json::string_t& s) override {
    if (state_ == State::kEntryValue && field_ == Field::kDType) {
      entries_.back().dtype = std::move(s);
      state_ = State::kEntry;
      return true;
    }
    if (state_ == State::kMetadataValue) {
      metadata_.emplace(std::move(key_), std::move(s));
      state_ = State::kMetadata;
      return true;
    }
    return Unexpected("a string");
  }

  bool number_unsigned(Json::number_unsigned_t v) override { return Number(v, false, {}); }
  bool number_integer(Json::number_integer_t v) override {
    if (v < 0) return Number(0, true, std::to_string(v));
    return Number(static_cast<uint64_t>(v), false, {});
  }
  bool number_float(Json::number_float_t, const Json::string_t& text) override {
    if (state_ == State::kShape || state_ == State::kOffsets)
      return Corrupt(TensorLabel(entries_.back().name) + ": " + ArrayName() + " holds " + text +
                     ", which is not an integer in [0, 2^64)");
    return Unexpected("a number");
  }

 private:
  enum class State { kStart, kTop, kTopValue, kMetadata, kMetadataValue, kEntry, kEntryValue, kShape, kOffsets, kDone };
  enum class Field { kDType, kShape, kOffsets };

  std::string ArrayName() const { return state_ == State::kShape ? "shape" : "data_offsets"; }

  bool Number(uint64_t v, bool negative, const std::string& text) {
    if (state_ != State::kShape && state_ != State::kOffsets) return Unexpected("a number");
    RawEntry& e = entries_.back();
    if (negative) return Corrupt(TensorLabel(e.name) + ": " + ArrayName() + " holds the negative value " + text);
    if (state_ == State::kShape) {
      if (e.shape.size() >= kMaxRank)
        return Corrupt(TensorLabel(e.name) + ": shape has more than " + std::to_string(kMaxRank) + " dimensions");
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return Corrupt(TensorLabel(e.name) + ": shape extent " + std::to_string(v) + " exceeds 2^63-1");
      e.shape.push_back(static_cast<int64_t>(v));
    } else {
      if (e.offsets.size() >= 2) return Corrupt(TensorLabel(e.name) + ": data_offsets has more than 2 values");
      e.offsets.push_back(v);
    }
    return true;
  }

  bool Unexpected(std::string_view found) override {
    const std::string f(found);
    switch (state_) {
      case State::kStart: return Corrupt("header is not a JSON object (it is " + f + ")");
      case State::kTop:
      case State::kDone: return Corrupt("header: unexpected " + f);
      case State::kTopValue:
        if (key_ == kMetadataKey) return Corrupt("__metadata__ must be an object of strings, not " + f);
        return Corrupt(TensorLabel(key_) + ": entry must be an object, not " + f);
      case State::kMetadata: return Corrupt("__metadata__: unexpected " + f);
      case State::kMetadataValue: return Corrupt("__metadata__: value of key " + QuoteUntrusted(key_) + " must be a string, not " + f);
      case State::kEntry: return Corrupt(TensorLabel(entries_.back().name) + ": unexpected " + f);
      case State::kEntryValue: {
        const std::string who = TensorLabel(entries_.back().name);
        if (field_ == Field::kDType) return Corrupt(who + ": dtype must be a string, not " + f);
        return Corrupt(who + ": " + (field_ == Field::kShape ? "shape" : "data_offsets") +
                       " must be an array of non-negative integers, not " + f);
      }
      case State::kShape:
      case State::kOffsets:
        return Corrupt(TensorLabel(entries_.back().name) + ": " + ArrayName() +
                       " must hold non-negative integers, not " + f);
    }
    return Corrupt("header: unexpected " + f);
  }

  std::string Where() const override {
    switch (state_) {
      case State::kEntry:
      case State::kEntryValue:
      case State::kShape:
      case State::kOffsets: return " (in the entry of " + TensorLabel(entries_.back().name) + ")";
      case State::kTopValue:
        return key_ == kMetadataKey ? " (in __metadata__)" : " (in the entry of " + TensorLabel(key_) + ")";
      case State::kMetadata:
      case State::kMetadataValue: return " (in __metadata__)";
      case State::kTop:
        return entries_.empty() ? std::string() : " (after the entry of " + TensorLabel(entries_.back().name) + ")";
      default: return {};
    }
  }

  State state_ = State::kStart;
  Field field_ = Field::kDType;
  std::string key_;
  std::unordered_set<std::string> top_keys_;
  std::vector<RawEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

bool IsUnsupportedPublishedDType(std::string_view name) {
  return std::find(kUnsupportedPublishedDTypes.begin(), kUnsupportedPublishedDTypes.end(), name) !=
         kUnsupportedPublishedDTypes.end();
}

// ---- index parsing ----

class IndexSax final : public StrictSax {
 public:
  explicit IndexSax(std::string_view file) : StrictSax(file) {}

  SafetensorsIndex& index() { return index_; }
  bool saw_weight_map() const { return saw_weight_map_; }

  bool start_object(std::size_t) override {
    if (skip_depth_ > 0) return Skip(+1);
    switch (state_) {
      case State::kStart: state_ = State::kTop; return true;
      case State::kTopValue:
        if (key_ == "metadata") { state_ = State::kMetadata; return true; }
        if (key_ == "weight_map") { state_ = State::kWeightMap; saw_weight_map_ = true; return true; }
        return Skip(+1);
      case State::kMetadataValue:
        if (key_ == "total_size") return Unexpected("an object");
        return Skip(+1);
      default: return Unexpected("an object");
    }
  }
  bool start_array(std::size_t) override {
    if (skip_depth_ > 0) return Skip(+1);
    if (state_ == State::kTopValue && key_ != "metadata" && key_ != "weight_map") return Skip(+1);
    if (state_ == State::kMetadataValue && key_ != "total_size") return Skip(+1);
    return Unexpected("an array");
  }
  bool end_object() override {
    if (skip_depth_ > 0) return Skip(-1);
    switch (state_) {
      case State::kTop: state_ = State::kDone; return true;
      case State::kMetadata:
      case State::kWeightMap: state_ = State::kTop; return true;
      default: return Unexpected("the end of an object");
    }
  }
  bool end_array() override {
    if (skip_depth_ > 0) return Skip(-1);
    return Unexpected("the end of an array");
  }

  bool key(Json::string_t& k) override {
    if (skip_depth_ > 0) return true;
    switch (state_) {
      case State::kTop:
        if (!top_keys_.insert(k).second) return Corrupt("duplicate key " + QuoteUntrusted(k));
        key_ = std::move(k);
        state_ = State::kTopValue;
        return true;
      case State::kMetadata:
        if (!metadata_keys_.insert(k).second) return Corrupt("metadata: duplicate key " + QuoteUntrusted(k));
        key_ = std::move(k);
        state_ = State::kMetadataValue;
        return true;
      case State::kWeightMap:
        if (!tensor_names_.insert(k).second) return Corrupt("weight_map: " + TensorLabel(k) + " appears twice");
        key_ = std::move(k);
        state_ = State::kWeightMapValue;
        return true;
      default: return Unexpected("a key");
    }
  }

  bool string(Json::string_t& s) override {
    if (skip_depth_ > 0) return true;
    switch (state_) {
      case State::kTopValue: return AfterSkippedScalar();
      case State::kMetadataValue:
        if (key_ == "total_size") return Unexpected("a string");
        index_.metadata.emplace(std::move(key_), std::move(s));
        state_ = State::kMetadata;
        return true;
      case State::kWeightMapValue:
        if (!IsSafeSafetensorsFileName(s))
          return Corrupt("weight_map: " + TensorLabel(key_) + " maps to the unsafe file name " + QuoteUntrusted(s) +
                         " (must be 1.." + std::to_string(kMaxFileNameBytes) +
                         " bytes, not '.' or '..', without '/', '\\' or NUL)");
        index_.weight_map.emplace_back(std::move(key_), std::move(s));
        state_ = State::kWeightMap;
        return true;
      default: return Unexpected("a string");
    }
  }

  bool number_unsigned(Json::number_unsigned_t v) override {
    if (skip_depth_ > 0) return true;
    if (state_ == State::kMetadataValue && key_ == "total_size") {
      index_.total_size = v;
      state_ = State::kMetadata;
      return true;
    }
    return Scalar("a number");
  }
  bool number_integer(Json::number_integer_t v) override {
    if (v >= 0) return number_unsigned(static_cast<uint64_t>(v));
    if (skip_depth_ > 0) return true;
    if (state_ == State::kMetadataValue && key_ == "total_size")
      return Corrupt("metadata: total_size " + std::to_string(v) + " is negative");
    return Scalar("a number");
  }
  bool number_float(Json::number_float_t, const Json::string_t& text) override {
    if (skip_depth_ > 0) return true;
    if (state_ == State::kMetadataValue && key_ == "total_size")
      return Corrupt("metadata: total_size " + text + " is not an integer in [0, 2^64)");
    return Scalar("a number");
  }

  // null and booleans: skipped where skipping is allowed.
  bool null() override { return Scalar("null"); }
  bool boolean(bool) override { return Scalar("a boolean"); }

 private:
  enum class State { kStart, kTop, kTopValue, kMetadata, kMetadataValue, kWeightMap, kWeightMapValue, kDone };
  static constexpr int kMaxSkipDepth = 64;

  // A scalar where a value of any type may be skipped (an unknown key), else an error.
  bool Scalar(std::string_view found) {
    if (skip_depth_ > 0) return true;
    if (state_ == State::kTopValue) return AfterSkippedScalar();
    if (state_ == State::kMetadataValue && key_ != "total_size") {
      state_ = State::kMetadata;
      return true;
    }
    return Unexpected(found);
  }
  bool AfterSkippedScalar() {
    if (key_ == "metadata" || key_ == "weight_map") return Unexpected("a scalar");
    state_ = State::kTop;
    return true;
  }
  // Enters or leaves a skipped container; on leaving the outermost, resumes the enclosing object.
  bool Skip(int delta) {
    if (delta > 0 && skip_depth_ == 0) resume_ = state_ == State::kTopValue ? State::kTop : State::kMetadata;
    skip_depth_ += delta;
    if (skip_depth_ > kMaxSkipDepth) return Corrupt("JSON nested deeper than " + std::to_string(kMaxSkipDepth) + " levels");
    if (skip_depth_ == 0) state_ = resume_;
    return true;
  }

  bool Unexpected(std::string_view found) override {
    const std::string f(found);
    switch (state_) {
      case State::kStart: return Corrupt("index is not a JSON object (it is " + f + ")");
      case State::kTopValue: return Corrupt(key_ + " must be an object, not " + f);
      case State::kMetadataValue:
        if (key_ == "total_size") return Corrupt("metadata: total_size must be a non-negative integer, not " + f);
        return Corrupt("metadata: unexpected " + f);
      case State::kWeightMapValue:
        return Corrupt("weight_map: " + TensorLabel(key_) + " must map to a file name string, not " + f);
      default: return Corrupt("unexpected " + f);
    }
  }

  std::string Where() const override {
    if (state_ == State::kWeightMapValue) return " (at " + TensorLabel(key_) + " in weight_map)";
    if (state_ == State::kWeightMap)
      return index_.weight_map.empty() ? " (in weight_map)"
                                       : " (in weight_map, after " + TensorLabel(index_.weight_map.back().first) + ")";
    return {};
  }

  State state_ = State::kStart;
  State resume_ = State::kTop;
  int skip_depth_ = 0;
  std::string key_;
  std::unordered_set<std::string> top_keys_, metadata_keys_, tensor_names_;
  bool saw_weight_map_ = false;
  SafetensorsIndex index_;
};

}  // namespace

std::optional<DType> ParseSafetensorsDType(std::string_view name) {
  for (const auto& d : kSupportedDTypes)
    if (d.name == name) return d.type;
  return std::nullopt;
}

std::string_view SafetensorsDTypeName(DType dtype) {
  for (const auto& d : kSupportedDTypes)
    if (d.type == dtype) return d.name;
  return {};
}

Result<uint64_t> DecodeSafetensorsHeaderLength(std::string_view first_bytes, uint64_t file_size, std::string_view file) {
  if (first_bytes.size() < kSafetensorsLengthBytes || file_size < kSafetensorsLengthBytes)
    return Status::Corruption(file, "file of " + std::to_string(std::min<uint64_t>(file_size, first_bytes.size())) +
                                        " bytes is too short for the 8-byte header length of a safetensors file");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(first_bytes[i]);
  if (n > kMaxSafetensorsHeaderBytes)
    return Status::Corruption(file, "header length " + std::to_string(n) + " exceeds the limit of " +
                                        std::to_string(kMaxSafetensorsHeaderBytes) + " bytes");
  if (n > file_size - kSafetensorsLengthBytes)
    return Status::Corruption(file, "header length " + std::to_string(n) + " runs past the end of the file (header would end at byte " +
                                        std::to_string(kSafetensorsLengthBytes + n) + ", file size " +
                                        std::to_string(file_size) + ")");
  return n;
}

Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view header_json, uint64_t data_bytes,
                                                 std::string_view file_for_errors) {
  HeaderSax sax(file_for_errors);
  LL_RETURN_IF_ERROR(RunSax(header_json, &sax, file_for_errors));

  const auto corrupt = [&](const std::string& msg) { return Status::Corruption(file_for_errors, msg); };
  SafetensorsHeader header;
  header.metadata = std::move(sax.metadata());
  header.data_offset = kSafetensorsLengthBytes + header_json.size();
  header.data_bytes = data_bytes;
  header.tensors.reserve(sax.entries().size());
  for (RawEntry& raw : sax.entries()) {
    if (std::string problem = TensorNameProblem(raw.name); !problem.empty())
      return Status::NotSupported(file_for_errors, problem);
    const std::optional<DType> dtype = ParseSafetensorsDType(raw.dtype);
    if (!dtype) {
      if (IsUnsupportedPublishedDType(raw.dtype))
        return Status::NotSupported(file_for_errors, TensorLabel(raw.name) + ": dtype " + QuoteUntrusted(raw.dtype) +
                                                         " has no Lifeline equivalent");
      return corrupt(TensorLabel(raw.name) + ": unknown dtype " + QuoteUntrusted(raw.dtype));
    }
    SafetensorsEntry e;
    e.name = std::move(raw.name);
    e.dtype = *dtype;
    e.shape = std::move(raw.shape);
    e.begin = raw.offsets[0];
    e.end = raw.offsets[1];
    LL_RETURN_IF_ERROR(CheckEntryBytes(e, data_bytes, SafetensorsDTypeName(e.dtype), corrupt));
    header.tensors.push_back(std::move(e));
  }
  LL_RETURN_IF_ERROR(SortAndCheckOverlap(&header.tensors, corrupt));
  return header;
}

Result<std::vector<SafetensorsEntry>> LayOutSafetensors(std::vector<SafetensorsEntry> entries) {
  uint64_t offset = 0;
  for (SafetensorsEntry& e : entries) {
    const std::string who = TensorLabel(e.name);
    if (DTypeSize(e.dtype) == 0)
      return Status::InvalidArgument(who, "invalid dtype code " + std::to_string(static_cast<int>(e.dtype)));
    if (e.shape.size() > kMaxRank)
      return Status::InvalidArgument(who, "shape has " + std::to_string(e.shape.size()) + " dimensions, more than " +
                                              std::to_string(kMaxRank));
    uint64_t elements = 1;
    for (int64_t d : e.shape) {
      if (d < 0) return Status::InvalidArgument(who, "shape " + ShapeString(e.shape) + " has a negative dimension");
      if (elements != 0 && static_cast<uint64_t>(d) > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / elements)
        return Status::InvalidArgument(who, "shape " + ShapeString(e.shape) + " has more than 2^63-1 elements");
      elements *= static_cast<uint64_t>(d);
    }
    const uint64_t size = DTypeSize(e.dtype);
    if (elements > std::numeric_limits<uint64_t>::max() / size ||
        elements * size > std::numeric_limits<uint64_t>::max() - offset)
      return Status::InvalidArgument(who, "byte offsets overflow 2^64");
    e.begin = offset;
    e.end = offset + elements * size;
    offset = e.end;
  }
  return entries;
}

Result<std::string> BuildSafetensorsPrefix(const std::vector<SafetensorsEntry>& entries,
                                           const std::map<std::string, std::string>& metadata) {
  constexpr std::string_view kWhat = "safetensors header";
  const auto invalid = [&](const std::string& msg) { return Status::InvalidArgument(kWhat, msg); };

  std::unordered_set<std::string_view> names;
  uint64_t expected_begin = 0;
  for (const SafetensorsEntry& e : entries) {
    if (std::string problem = TensorNameProblem(e.name); !problem.empty()) return invalid(problem);
    if (e.name == kMetadataKey) return invalid("'__metadata__' cannot name a tensor");
    if (!IsValidUtf8(e.name)) return invalid(TensorLabel(e.name) + ": name is not valid UTF-8");
    if (!names.insert(e.name).second) return invalid(TensorLabel(e.name) + " appears twice");
    if (e.begin != expected_begin)
      return invalid(TensorLabel(e.name) + ": data_offsets " + RangeText(e.begin, e.end) + " must begin at " +
                     std::to_string(expected_begin) + ", where the previous tensor ends (see LayOutSafetensors)");
    const std::string_view dtype_name = SafetensorsDTypeName(e.dtype);
    LL_RETURN_IF_ERROR(CheckEntryBytes(e, std::numeric_limits<uint64_t>::max(), dtype_name, invalid));
    expected_begin = e.end;
  }
  for (const auto& [k, v] : metadata) {
    if (!IsValidUtf8(k)) return invalid("__metadata__: key " + QuoteUntrusted(k) + " is not valid UTF-8");
    if (!IsValidUtf8(v)) return invalid("__metadata__: value of key " + QuoteUntrusted(k) + " is not valid UTF-8");
  }

  std::string json;
  json.push_back('{');
  bool first = true;
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    for (const auto& [k, v] : metadata) {
      if (!first) json.push_back(',');
      first = false;
      AppendJsonString(&json, k);
      json.push_back(':');
      AppendJsonString(&json, v);
    }
    json.push_back('}');
    first = false;
  }
  for (const SafetensorsEntry& e : entries) {
    if (!first) json.push_back(',');
    first = false;
    AppendJsonString(&json, e.name);
    json += ":{\"dtype\":\"";
    json += SafetensorsDTypeName(e.dtype);
    json += "\",\"shape\":[";
    for (size_t i = 0; i < e.shape.size(); ++i) {
      if (i) json.push_back(',');
      json += std::to_string(e.shape[i]);
    }
    json += "],\"data_offsets\":[" + std::to_string(e.begin) + "," + std::to_string(e.end) + "]}";
  }
  json.push_back('}');
  json.append((8 - json.size() % 8) % 8, ' ');
  if (json.size() > kMaxSafetensorsHeaderBytes)
    return invalid("header of " + std::to_string(json.size()) + " bytes exceeds the limit of " +
                   std::to_string(kMaxSafetensorsHeaderBytes));

  std::string out(kSafetensorsLengthBytes, '\0');
  uint64_t n = json.size();
  for (size_t i = 0; i < kSafetensorsLengthBytes; ++i, n >>= 8) out[i] = static_cast<char>(n & 0xff);
  out += json;
  return out;
}

std::vector<std::vector<size_t>> PlanSafetensorsShards(const std::vector<uint64_t>& tensor_bytes,
                                                       uint64_t max_shard_bytes) {
  std::vector<std::vector<size_t>> shards(1);
  uint64_t current = 0;
  for (size_t i = 0; i < tensor_bytes.size(); ++i) {
    const uint64_t t = tensor_bytes[i];
    if (max_shard_bytes != 0 && !shards.back().empty() && (current > max_shard_bytes || t > max_shard_bytes - current)) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(i);
    current = t > std::numeric_limits<uint64_t>::max() - current ? std::numeric_limits<uint64_t>::max() : current + t;
  }
  return shards;
}

std::string SafetensorsShardName(size_t i, size_t n) {
  if (n == 1) return "model.safetensors";
  char buf[96];
  std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

bool IsSafeSafetensorsFileName(std::string_view name) {
  if (name.empty() || name.size() > kMaxFileNameBytes || name == "." || name == "..") return false;
  return name.find_first_of(std::string_view("/\\\0", 3)) == std::string_view::npos;
}

Result<std::string> BuildSafetensorsIndex(uint64_t total_size,
                                          const std::vector<std::pair<std::string, std::string>>& weight_map,
                                          const std::map<std::string, std::string>& metadata) {
  constexpr std::string_view kWhat = "safetensors index";
  const auto invalid = [&](const std::string& msg) { return Status::InvalidArgument(kWhat, msg); };
  for (const auto& [k, v] : metadata) {
    if (k == "total_size") return invalid("metadata key 'total_size' is reserved for the total size");
    if (!IsValidUtf8(k) || !IsValidUtf8(v)) return invalid("metadata entry " + QuoteUntrusted(k) + " is not valid UTF-8");
  }
  std::unordered_set<std::string_view> names;
  for (const auto& [tensor, file] : weight_map) {
    if (std::string problem = TensorNameProblem(tensor); !problem.empty()) return invalid(problem);
    if (!IsValidUtf8(tensor)) return invalid(TensorLabel(tensor) + ": name is not valid UTF-8");
    if (!names.insert(tensor).second) return invalid(TensorLabel(tensor) + " appears twice in the weight map");
    if (!IsSafeSafetensorsFileName(file) || !IsValidUtf8(file))
      return invalid(TensorLabel(tensor) + ": unsafe file name " + QuoteUntrusted(file));
  }

  std::string out = "{\n  \"metadata\": {\n    \"total_size\": " + std::to_string(total_size);
  for (const auto& [k, v] : metadata) {
    out += ",\n    ";
    AppendJsonString(&out, k);
    out += ": ";
    AppendJsonString(&out, v);
  }
  out += "\n  },\n  \"weight_map\": {";
  for (size_t i = 0; i < weight_map.size(); ++i) {
    out += i ? ",\n    " : "\n    ";
    AppendJsonString(&out, weight_map[i].first);
    out += ": ";
    AppendJsonString(&out, weight_map[i].second);
  }
  out += weight_map.empty() ? "}\n}\n" : "\n  }\n}\n";
  return out;
}

Result<SafetensorsIndex> ParseSafetensorsIndex(std::string_view json, std::string_view file_for_errors) {
  IndexSax sax(file_for_errors);
  LL_RETURN_IF_ERROR(RunSax(json, &sax, file_for_errors));
  if (!sax.saw_weight_map()) return Status::Corruption(file_for_errors, "no \"weight_map\" object");
  SafetensorsIndex index = std::move(sax.index());
  std::unordered_set<std::string_view> files;
  for (const auto& [tensor, file] : index.weight_map) {
    if (std::string problem = TensorNameProblem(tensor); !problem.empty())
      return Status::NotSupported(file_for_errors, "weight_map: " + problem);
    if (files.insert(file).second) index.files.push_back(file);
  }
  return index;
}

}  // namespace lifeline::format
