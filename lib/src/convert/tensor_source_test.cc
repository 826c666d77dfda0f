// OpenTensorSource and the sources behind it, run through the in-memory Env (safetensors, a
// checkpoint) and the POSIX one (what only a real file system has: FIFOs).
#include "lib/src/convert/tensor_source.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lib/src/convert/test_sources.h"
#include "lifeline/convert.h"
#include "lifeline/env.h"
#include "tests/kit/test_kit.h"

// In the test kits' namespace (test_sources.h, tests/kit/test_kit.h): their helpers need no prefix.
namespace lifeline::test {
namespace tensor_source_test {

// Counts the files opened for reading, per path.
class CountingEnv : public EnvWrapper {
 public:
  using EnvWrapper::EnvWrapper;
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path,
                                                                const FileOptions& options) override {
    ++opens[path];
    return EnvWrapper::NewRandomAccessFile(path, options);
  }
  std::map<std::string, int> opens;
};

class TensorSourceTest : public ::testing::Test {
 protected:
  SourceOptions Options() {
    SourceOptions o;
    o.env = mem_.get();
    return o;
  }
  std::unique_ptr<MemEnv> mem_ = NewMemEnv();
};

TEST_F(TensorSourceTest, ReadsASafetensorsFileThroughTheEnv) {
  const TestTensor w = F32Tensor("model.w", {2, 3}, 10);
  const TestTensor b = F32Tensor("model.b", {3}, 100);
  WriteSafetensors(mem_.get(), "/in/model.safetensors", {w, b}, {{"lifeline_step", "7"}, {"run", "abc"}});

  Result<std::unique_ptr<TensorSource>> opened = OpenTensorSource("/in/model.safetensors", Options());
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  TensorSource& src = **opened;
  EXPECT_EQ(SourceKind::kSafetensors, src.kind());
  EXPECT_EQ("safetensors", SourceKindName(src.kind()));
  ASSERT_EQ(2u, src.tensors().size());
  EXPECT_EQ("model.w", src.tensors()[0].name);
  EXPECT_EQ((std::vector<int64_t>{2, 3}), src.tensors()[0].shape);
  EXPECT_EQ(24u, src.tensors()[0].num_bytes());
  EXPECT_EQ(7u, src.step().value_or(0));
  EXPECT_EQ(R"({"run":"abc"})", src.metadata_json());
  EXPECT_EQ(w.bytes, ReadWhole(src, 0));
  EXPECT_EQ(b.bytes, ReadWhole(src, 1));

  // The second row's last two elements: box [1, 0] of extent [1, 3], elements [1, 3) of it.
  float got[2] = {};
  ASSERT_TRUE(src.Read(0, TensorRegion{{1, 0}, {1, 3}, 1, 3}, got).ok());
  EXPECT_EQ(14.0f, got[0]);
  EXPECT_EQ(15.0f, got[1]);
  // A region outside the tensor is refused, naming the tensor.
  Status s = src.Read(0, TensorRegion{{2, 0}, {1, 3}, 0, 3}, got);
  EXPECT_EQ(StatusCode::kInvalidArgument, s.code()) << s.ToString();
  EXPECT_TRUE(StatusMentions(s, "model.w")) << s.ToString();
}

TEST_F(TensorSourceTest, OpensEachFileOnce) {
  CountingEnv counting(mem_.get());
  SourceOptions o;
  o.env = &counting;
  WriteSafetensors(mem_.get(), "/shards/model-00001-of-00002.safetensors", {F32Tensor("a", {4}, 0)});
  WriteSafetensors(mem_.get(), "/shards/model-00002-of-00002.safetensors", {F32Tensor("b", {4}, 4)});
  Result<std::unique_ptr<TensorSource>> opened = OpenTensorSource("/shards", o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_EQ(2u, (*opened)->tensors().size());
  // The header and the tensors are read through the same file object.
  EXPECT_EQ(1, counting.opens["/shards/model-00001-of-00002.safetensors"]);
  EXPECT_EQ(1, counting.opens["/shards/model-00002-of-00002.safetensors"]);
  EXPECT_EQ(2u, counting.opens.size());
}

TEST_F(TensorSourceTest, ReadsShardsListedByAnIndexAndRefusesAMisplacedTensor) {
  WriteSafetensors(mem_.get(), "/idx/model-00001-of-00002.safetensors", {F32Tensor("a", {4}, 0)});
  WriteSafetensors(mem_.get(), "/idx/model-00002-of-00002.safetensors", {F32Tensor("b", {2}, 4)});
  const std::string good = R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                               "b": "model-00002-of-00002.safetensors"}})";
  ASSERT_TRUE(WriteFileAtomically(mem_.get(), "/idx/model.safetensors.index.json", good).ok());
  Result<std::unique_ptr<TensorSource>> opened = OpenTensorSource("/idx", Options());
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  ASSERT_EQ(2u, (*opened)->tensors().size());
  EXPECT_EQ(F32Tensor("b", {2}, 4).bytes, ReadWhole(**opened, 1));

  const std::string wrong = R"({"weight_map": {"a": "model-00002-of-00002.safetensors",
                                                "b": "model-00002-of-00002.safetensors"}})";
  ASSERT_TRUE(WriteFileAtomically(mem_.get(), "/idx/model.safetensors.index.json", wrong).ok());
  opened = OpenTensorSource("/idx", Options());
  EXPECT_EQ(StatusCode::kCorruption, opened.status().code()) << opened.status().ToString();
  EXPECT_TRUE(StatusMentions(opened.status(), "'a'")) << opened.status().ToString();
}

TEST_F(TensorSourceTest, ABoolByteOtherThanZeroOrOneIsCorruptionNamingTheElement) {
  TestTensor flags{"flags", DType::kBool, {2, 2}, std::string("\x01\x00\x02\x01", 4)};
  WriteSafetensors(mem_.get(), "/in/flags.safetensors", {flags});
  Result<std::unique_ptr<TensorSource>> opened = OpenTensorSource("/in/flags.safetensors", Options());
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::string out(4, '\0');
  Status s = (*opened)->Read(0, TensorRegion::Whole((*opened)->tensors()[0]), out.data());
  EXPECT_EQ(StatusCode::kCorruption, s.code()) << s.ToString();
  EXPECT_TRUE(StatusMentions(s, "'flags'")) << s.ToString();
  EXPECT_TRUE(StatusMentions(s, "0x02 at element 2 [1, 0]")) << s.ToString();
}

TEST_F(TensorSourceTest, ReadsACheckpointWrittenThroughTheSameEnv) {
  const TestTensor w = F32Tensor("w", {4, 2}, 1);
  WriteSafetensors(mem_.get(), "/in/m.safetensors", {w}, {{"lifeline_step", "12"}});
  Result<std::unique_ptr<TensorSource>> st = OpenTensorSource("/in/m.safetensors", Options());
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ConvertOptions co;
  co.env = mem_.get();
  co.ranks = 2;
  co.tp = 2;
  Result<ConvertReport> written = Convert(**st, ConvertFormat::kLifeline, "/ckpt", co);
  ASSERT_TRUE(written.ok()) << written.status().ToString();

  Result<std::unique_ptr<TensorSource>> opened = OpenTensorSource("/ckpt", Options());
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  TensorSource& src = **opened;
  EXPECT_EQ(SourceKind::kCheckpoint, src.kind());
  EXPECT_EQ("checkpoint /ckpt step 12", src.description());
  EXPECT_EQ(12u, src.step().value_or(0));
  EXPECT_EQ(2u, src.saved_world_size());
  ASSERT_EQ(1u, src.tensors().size());
  EXPECT_EQ(w.bytes, ReadWhole(src, 0));
  // A step that is not there.
  SourceOptions other = Options();
  other.step = 13;
  EXPECT_FALSE(OpenTensorSource("/ckpt", other).ok());
}

TEST_F(TensorSourceTest, RefusesWhatItDoesNotRecognise) {
  Result<std::unique_ptr<TensorSource>> missing = OpenTensorSource("/nowhere.safetensors", Options());
  EXPECT_EQ(StatusCode::kNotFound, missing.status().code()) << missing.status().ToString();
  EXPECT_TRUE(StatusMentions(missing.status(), "/nowhere.safetensors")) << missing.status().ToString();

  ASSERT_TRUE(mem_->CreateDir("/empty").ok());
  Result<std::unique_ptr<TensorSource>> empty = OpenTensorSource("/empty", Options());
  EXPECT_EQ(StatusCode::kInvalidArgument, empty.status().code()) << empty.status().ToString();

  ASSERT_TRUE(WriteFileAtomically(mem_.get(), "/notes.txt", "hello, not a tensor file").ok());
  Result<std::unique_ptr<TensorSource>> text = OpenTensorSource("/notes.txt", Options());
  EXPECT_EQ(StatusCode::kInvalidArgument, text.status().code()) << text.status().ToString();
  EXPECT_TRUE(StatusMentions(text.status(), "neither an HDF5 file nor a safetensors file")) << text.status().ToString();
}

TEST_F(TensorSourceTest, Hdf5NeedsThePosixEnv) {
  // The HDF5 signature is enough to be taken for HDF5; libhdf5 could not read it from memory.
  std::string bytes("\x89HDF\r\n\x1a\n", 8);
  bytes.resize(1024, '\0');
  ASSERT_TRUE(WriteFileAtomically(mem_.get(), "/x.h5", bytes).ok());
  Result<std::unique_ptr<TensorSource>> opened = OpenTensorSource("/x.h5", Options());
  EXPECT_EQ(StatusCode::kNotSupported, opened.status().code()) << opened.status().ToString();
  EXPECT_TRUE(StatusMentions(opened.status(), "/x.h5")) << opened.status().ToString();
}

// Moved from formats/safetensors_test.cc with the opening of files (formats does no I/O).
TEST(TensorSourcePosixTest, WhatIsNotARegularFileIsRefused) {
  TempDir dir;
  Result<std::unique_ptr<RandomAccessFile>> opened = OpenUserFile(Env::Default(), dir.path());
  EXPECT_EQ(StatusCode::kInvalidArgument, opened.status().code()) << opened.status().ToString();
  EXPECT_TRUE(StatusMentions(opened.status(), dir.path())) << opened.status().ToString();
  EXPECT_TRUE(StatusMentions(opened.status(), "not a regular file")) << opened.status().ToString();
  opened = OpenUserFile(Env::Default(), dir.Sub("missing.safetensors"));
  EXPECT_EQ(StatusCode::kNotFound, opened.status().code()) << opened.status().ToString();
  EXPECT_TRUE(StatusMentions(opened.status(), "missing.safetensors")) << opened.status().ToString();
  // A link to a file is followed: the user named it.
  const std::string file = dir.Write("real.safetensors", "x");
  ASSERT_EQ(0, ::symlink(file.c_str(), dir.Sub("link.safetensors").c_str()));
  EXPECT_TRUE(OpenUserFile(Env::Default(), dir.Sub("link.safetensors")).ok());
}

TEST(TensorSourcePosixTest, AFifoIsRefusedWithoutBlocking) {
  TempDir dir;
  const std::string fifo = dir.Sub("pipe.safetensors");
  ASSERT_EQ(0, ::mkfifo(fifo.c_str(), 0600));
  Result<std::unique_ptr<TensorSource>> opened = OpenTensorSource(fifo);
  EXPECT_EQ(StatusCode::kInvalidArgument, opened.status().code()) << opened.status().ToString();
  // A directory of shards where one "shard" is a FIFO.
  const std::string shard_dir = dir.Sub("shards");
  ASSERT_EQ(0, ::mkdir(shard_dir.c_str(), 0700));
  ASSERT_EQ(0, ::mkfifo((shard_dir + "/model.safetensors").c_str(), 0600));
  opened = OpenTensorSource(shard_dir);
  EXPECT_EQ(StatusCode::kInvalidArgument, opened.status().code()) << opened.status().ToString();
  EXPECT_TRUE(StatusMentions(opened.status(), "not a regular file")) << opened.status().ToString();
  // A link to a FIFO: the link is followed for a file the user names, but the FIFO never opened.
  const std::string link = dir.Sub("link.safetensors");
  ASSERT_EQ(0, ::symlink(fifo.c_str(), link.c_str()));
  opened = OpenTensorSource(link);
  EXPECT_EQ(StatusCode::kInvalidArgument, opened.status().code()) << opened.status().ToString();
  EXPECT_TRUE(StatusMentions(opened.status(), link)) << opened.status().ToString();
}

TEST(TensorSourceNamesTest, Hdf5DatasetNamesAndBase64RoundTrip) {
  for (const std::string name : {"a/b", "%", ".hidden", "..", "plain.name", "50%/x"}) {
    const std::string ds = Hdf5DatasetName(name);
    EXPECT_EQ(std::string::npos, ds.find('/')) << name;
    EXPECT_NE('.', ds[0]) << name;
    EXPECT_EQ(name, Hdf5NameFromDataset(ds));
  }
  for (const std::string& bytes : {std::string(), std::string("a"), std::string("ab"), std::string("abc"),
                                  std::string("\x00\xff\x10\x80", 4)}) {
    Result<std::string> back = Base64Decode(Base64Encode(bytes));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(bytes, *back);
  }
  EXPECT_EQ("YWJj", Base64Encode("abc"));
  EXPECT_FALSE(Base64Decode("YW=j").ok());
  EXPECT_FALSE(Base64Decode("YWJ").ok());
}

}  // namespace tensor_source_test
}  // namespace lifeline::test
