// Snapshot replication streams: files arrive whole and bit-identical under their names; a chunk
// damaged in transit, a stream broken off, a name that would leave the receiver's root, a file
// named twice and a cancelled stream leave nothing behind; the sender writes the layout of
// formats/SPEC.md §16 and keeps to its bandwidth budget.
#include "lib/net/replica_stream.h"

#include <netinet/in.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "lib/net/socket.h"
#include "formats/checksum.h"
#include "tests/kit/test_kit.h"

namespace lifeline::replication {
namespace {

class ReplicaStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(src_.path().empty());
    ASSERT_FALSE(dst_.path().empty());
    auto r = ReplicaReceiver::Start(dst_.Sub("replicas"));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    receiver_ = std::move(*r);
  }

  ReplicaSendOptions To() const {
    ReplicaSendOptions o;
    o.host = "localhost";
    o.port = receiver_->port();
    o.chunk_bytes = 64 << 10;
    return o;
  }

  // The receiver finishes its side (counters, cleanup) just after it acknowledges.
  ReplicaReceiver::Counters SettledCounters(uint64_t streams, uint64_t refused) {
    for (int i = 0; i < 200; ++i) {
      ReplicaReceiver::Counters c = receiver_->counters();
      if (c.streams >= streams && c.refused >= refused) return c;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return receiver_->counters();
  }

  test::TempDir src_{"/dev/shm", "lifeline-replica-src"};
  test::TempDir dst_{"/dev/shm", "lifeline-replica-dst"};
  std::unique_ptr<ReplicaReceiver> receiver_;
};

TEST_F(ReplicaStreamTest, FilesArriveWholeUnderTheirNames) {
  const std::string data = test::PatternBytes((3 << 20) + 12345, 7);  // not a whole number of chunks
  const std::string index = test::PatternBytes(999, 8);
  std::vector<ReplicaFile> files = {{"abc.r000002-of-000004.data", src_.Write("d", data)},
                                    {"abc.r000002-of-000004.index", src_.Write("i", index)},
                                    {"empty", src_.Write("e", "")}};
  auto sent = SendReplica(To(), "step-00000000000000000040", files);
  ASSERT_TRUE(sent.ok()) << sent.status().ToString();
  EXPECT_EQ(sent->bytes, data.size() + index.size());
  const std::string dir = dst_.Sub("replicas/step-00000000000000000040");
  EXPECT_EQ(test::ReadWholeFile(dir + "/abc.r000002-of-000004.data"), data);
  EXPECT_EQ(test::ReadWholeFile(dir + "/abc.r000002-of-000004.index"), index);
  EXPECT_EQ(test::ListDir(dir).size(), 3u) << "partial files left behind";
  ReplicaReceiver::Counters c = SettledCounters(1, 0);
  EXPECT_EQ(c.streams, 1u);
  EXPECT_EQ(c.files, 3u);
  EXPECT_EQ(c.bytes, data.size() + index.size());
}

// A sender that speaks the protocol but flips a bit of one chunk after checksumming it.
void SendDamaged(uint16_t port, const std::string& payload) {
  auto fd = net::Connect("localhost", port, net::Clock::now() + std::chrono::seconds(5));
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  struct {
    char magic[8];
    uint32_t dir_size, file_count;
  } h{{'L', 'L', 'R', 'E', 'P', 'L', '0', '1'}, 4, 1};
  struct {
    uint32_t name_size, reserved;
    uint64_t bytes;
  } f{4, 0, payload.size()};
  struct {
    uint64_t bytes, checksum;
  } c{payload.size(), 0};
  c.checksum = format::Checksum64(payload);
  std::string bad = payload;
  bad[bad.size() / 2] ^= 0x10;
  ASSERT_TRUE(net::SendAll(*fd, &h, sizeof(h), "r").ok());
  ASSERT_TRUE(net::SendAll(*fd, "s-40", 4, "r").ok());
  ASSERT_TRUE(net::SendAll(*fd, &f, sizeof(f), "r").ok());
  ASSERT_TRUE(net::SendAll(*fd, "data", 4, "r").ok());
  ASSERT_TRUE(net::SendAll(*fd, &c, sizeof(c), "r").ok());
  ASSERT_TRUE(net::SendAll(*fd, bad.data(), bad.size(), "r").ok());
  char ack[8];
  EXPECT_TRUE(net::RecvAll(*fd, ack, sizeof(ack), "r").ok());
  EXPECT_EQ(ack[0], 'E');
  ::close(*fd);
}

// A superseded replica's files are written again by the next stream: same inode (its memory kept),
// the new bytes in it, whatever the sizes.
TEST_F(ReplicaStreamTest, ARecycledReplicasFilesAreWrittenAgainInPlace) {
  const std::string first = test::PatternBytes(1 << 20, 1);
  ASSERT_TRUE(SendReplica(To(), "step-10", {{"data", src_.Write("a", first)}}).ok());
  struct stat before{};
  ASSERT_EQ(::stat(dst_.Sub("replicas/step-10/data").c_str(), &before), 0);
  ASSERT_TRUE(receiver_->Recycle("step-10").ok());
  EXPECT_FALSE(Env::Default()->IsDirectory(dst_.Sub("replicas/step-10")));
  EXPECT_TRUE(receiver_->Recycle("step-10").IsNotFound());

  const std::string second = test::PatternBytes((1 << 20) - 4321, 2);  // a little smaller
  auto sent = SendReplica(To(), "step-20", {{"data", src_.Write("b", second)}});
  ASSERT_TRUE(sent.ok()) << sent.status().ToString();
  struct stat after{};
  ASSERT_EQ(::stat(dst_.Sub("replicas/step-20/data").c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino) << "the spare was not reused";
  EXPECT_EQ(test::ReadWholeFile(dst_.Sub("replicas/step-20/data")), second);
  EXPECT_EQ(receiver_->Recycle("../outside").code(), StatusCode::kInvalidArgument);
}

TEST_F(ReplicaStreamTest, AChunkDamagedInTransitIsRefusedAndLeavesNothing) {
  SendDamaged(receiver_->port(), test::PatternBytes(100000, 3));
  ReplicaReceiver::Counters c = SettledCounters(0, 1);
  EXPECT_EQ(c.refused, 1u);
  EXPECT_NE(c.last_error.find("replica s-40/data"), std::string::npos) << c.last_error;
  EXPECT_NE(c.last_error.find("fails its checksum in transit"), std::string::npos) << c.last_error;
  EXPECT_TRUE(test::ListDir(dst_.Sub("replicas/s-40")).empty()) << "a damaged replica was kept";
}

TEST_F(ReplicaStreamTest, NamesThatWouldLeaveTheRootAreRefused) {
  for (const std::string bad : {"..", "../x", "a/b", ".hidden", "", "x\n"}) {
    EXPECT_FALSE(IsReplicaName(bad)) << bad;
    auto sent = SendReplica(To(), bad, {});
    EXPECT_EQ(sent.status().code(), StatusCode::kInvalidArgument) << bad;
    sent = SendReplica(To(), "step-1", {{bad, src_.Write("f", "x")}});
    EXPECT_EQ(sent.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_TRUE(IsReplicaName("abc.r000002-of-000004.data"));
  EXPECT_TRUE(test::ListDir(dst_.Sub("replicas")).empty());
}

TEST_F(ReplicaStreamTest, ACancelledStreamLeavesNothingAndSaysSo) {
  const std::string data = test::PatternBytes(4 << 20, 5);
  ReplicaSendOptions o = To();
  int chunks = 0;
  o.cancelled = [&chunks] { return ++chunks > 3; };  // a newer snapshot after three chunks
  auto sent = SendReplica(o, "step-7", {{"data", src_.Write("d", data)}});
  ASSERT_EQ(sent.status().code(), StatusCode::kAborted) << sent.status().ToString();
  ReplicaReceiver::Counters c = SettledCounters(0, 1);
  EXPECT_EQ(c.refused, 1u);
  EXPECT_TRUE(test::ListDir(dst_.Sub("replicas/step-7")).empty());
}

TEST_F(ReplicaStreamTest, AnUnreachableReceiverIsUnavailableNamingIt) {
  ReplicaSendOptions o = To();
  receiver_.reset();  // nobody listens there now
  o.connect_timeout_seconds = 1;
  auto sent = SendReplica(o, "step-1", {{"f", src_.Write("f", "x")}});
  ASSERT_FALSE(sent.ok());
  EXPECT_NE(sent.status().ToString().find("localhost:" + std::to_string(o.port)), std::string::npos)
      << sent.status().ToString();
}

// A stream laid out as formats/SPEC.md §16 says, each file in one chunk (little-endian host).
std::string EncodeStream(const std::string& dir, const std::vector<std::pair<std::string, std::string>>& files) {
  std::string out("LLREPL01");
  auto put32 = [&out](uint32_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  auto put64 = [&out](uint64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put32(static_cast<uint32_t>(dir.size()));
  put32(static_cast<uint32_t>(files.size()));
  out += dir;
  for (const auto& [name, data] : files) {
    put32(static_cast<uint32_t>(name.size()));
    put32(0);
    put64(data.size());
    out += name;
    if (data.empty()) continue;
    put64(data.size());
    out += data;
    put64(format::Checksum64(data));
  }
  return out;
}

// Reads `bytes` from the start; "connection closed" past their end, as a socket would.
StreamReader FromBytes(const std::string& bytes) {
  auto at = std::make_shared<size_t>(0);
  return [&bytes, at](void* out, size_t n) {
    if (n > bytes.size() - *at) return Status::IOError("replica sender", "connection closed");
    std::memcpy(out, bytes.data() + *at, n);
    *at += n;
    return Status::OK();
  };
}

TEST_F(ReplicaStreamTest, TheSenderWritesTheSpecsLayoutAndItsBytesArePlacedFromABuffer) {
  // A receiver that keeps a copy of every byte it reads from the socket, then acknowledges.
  auto listener = net::Listen(0, 1, "capture");
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  auto tee = ReplicaReceiver::WithoutPort(dst_.Sub("tee"));
  ASSERT_TRUE(tee.ok()) << tee.status().ToString();
  std::string captured;
  Status teed;
  std::thread capture([&] {
    const int fd = ::accept(*listener, nullptr, nullptr);
    uint64_t bytes = 0, files = 0;
    teed = (*tee)->ReceiveStream(
        [&](void* out, size_t n) {
          Status s = net::RecvAll(fd, out, n, "sender");
          if (s.ok()) captured.append(static_cast<const char*>(out), n);
          return s;
        },
        &bytes, &files);
    const char ack[8] = {'K', 0, 0, 0, 0, 0, 0, 0};
    net::SendAll(fd, ack, sizeof(ack), "sender").IgnoreError();
    ::close(fd);
  });
  const std::vector<std::pair<std::string, std::string>> content = {
      {"a.index", test::PatternBytes(300, 1)}, {"empty", ""}, {"b.data", test::PatternBytes(1000, 2)}};
  std::vector<ReplicaFile> files;
  for (const auto& [name, data] : content) files.push_back({name, src_.Write(name, data)});
  ReplicaSendOptions o = To();
  o.port = net::LocalPort(*listener);
  auto sent = SendReplica(o, "step-3", files);
  capture.join();
  ::close(*listener);
  ASSERT_TRUE(sent.ok()) << sent.status().ToString();
  ASSERT_TRUE(teed.ok()) << teed.ToString();
  EXPECT_EQ(captured, EncodeStream("step-3", content));

  auto from_bytes = ReplicaReceiver::WithoutPort(dst_.Sub("from-bytes"));
  ASSERT_TRUE(from_bytes.ok());
  EXPECT_EQ((*from_bytes)->port(), 0);
  uint64_t bytes = 0, placed = 0;
  Status s = (*from_bytes)->ReceiveStream(FromBytes(captured), &bytes, &placed);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(placed, 3u);
  EXPECT_EQ(bytes, 1300u);
  for (const auto& [name, data] : content) EXPECT_EQ(test::ReadWholeFile(dst_.Sub("from-bytes/step-3/" + name)), data);
}

// Every stream cut short is refused and leaves nothing, however far it got.
TEST_F(ReplicaStreamTest, AStreamCutShortAnywhereLeavesNothing) {
  const std::string whole = EncodeStream("step-5", {{"x", "12345"}, {"y", ""}, {"z", "abc"}});
  auto r = ReplicaReceiver::WithoutPort(dst_.Sub("cut"));
  ASSERT_TRUE(r.ok());
  for (size_t n = 0; n < whole.size(); ++n) {
    const std::string cut = whole.substr(0, n);
    uint64_t bytes = 0, files = 0;
    EXPECT_FALSE((*r)->ReceiveStream(FromBytes(cut), &bytes, &files).ok()) << n;
    EXPECT_TRUE(test::ListDir(dst_.Sub("cut")).empty()) << "left behind after " << n << " bytes";
  }
}

// Two files of one stream under one name: the first would be placed, and the second, finding its
// partial file gone, would refuse the stream with the first left in place.
TEST_F(ReplicaStreamTest, AFileNamedTwiceInAStreamIsRefusedAndLeavesNothing) {
  auto r = ReplicaReceiver::WithoutPort(dst_.Sub("twice"));
  ASSERT_TRUE(r.ok());
  uint64_t bytes = 0, files = 0;
  Status s = (*r)->ReceiveStream(FromBytes(EncodeStream("step-9", {{"data", "first"}, {"data", "second"}})), &bytes,
                                 &files);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.ToString().find("step-9/data"), std::string::npos) << s.ToString();
  EXPECT_TRUE(test::ListDir(dst_.Sub("twice")).empty()) << "a refused stream left a file";

  auto sent = SendReplica(To(), "step-9", {{"data", src_.Write("a", "first")}, {"data", src_.Write("b", "second")}});
  EXPECT_EQ(sent.status().code(), StatusCode::kInvalidArgument) << sent.status().ToString();
}

TEST_F(ReplicaStreamTest, TheSenderKeepsToItsBandwidthBudget) {
  const std::string data = test::PatternBytes(2 << 20, 9);
  ReplicaSendOptions o = To();
  o.bandwidth_bytes_per_second = 8 << 20;  // 2 MiB at 8 MiB/s: a quarter of a second at least
  auto sent = SendReplica(o, "step-2", {{"data", src_.Write("d", data)}});
  ASSERT_TRUE(sent.ok()) << sent.status().ToString();
  EXPECT_GE(sent->seconds, 0.2) << "unthrottled";
  EXPECT_EQ(test::ReadWholeFile(dst_.Sub("replicas/step-2/data")), data);
}

}  // namespace
}  // namespace lifeline::replication
