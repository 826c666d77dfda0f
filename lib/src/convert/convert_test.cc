// Convert() (lifeline/convert.h) and the exporters behind it: round trips through every format,
// in memory (MemEnv) and on disk (HDF5, which libhdf5 writes itself), and failures injected
// mid-conversion (FaultInjectionEnv): nothing is published and the error names the file.
#include "lib/src/convert/convert.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "formats/safetensors.h"
#include "lib/src/convert/test_sources.h"
#include "lifeline/convert.h"
#include "lifeline/env.h"
#include "tests/kit/test_kit.h"

// In the test kits' namespace (test_sources.h, tests/kit/test_kit.h): their helpers need no prefix.
namespace lifeline::test {
namespace convert_test {

bool AnyTempFile(Env* env, const std::string& dir) {
  Result<std::vector<std::string>> children = env->GetChildren(dir);
  if (!children.ok()) return false;
  return std::any_of(children->begin(), children->end(),
                     [](const std::string& c) { return c.find(".tmp-") != std::string::npos; });
}

class ConvertTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Two tensors, an object of rank 1 (base64 "b2Jq" = "obj") and user metadata.
    WriteSafetensors(mem_.get(), "/in/model.safetensors", {w_, b_},
                     {{"lifeline_step", "5"}, {"lifeline_object.1.rng", "b2Jq"}, {"run", "r1"}});
    source_ = Open("/in/model.safetensors", mem_.get());
    ASSERT_NE(nullptr, source_);
  }

  static std::unique_ptr<TensorSource> Open(const std::string& path, Env* env) {
    SourceOptions o;
    o.env = env;
    Result<std::unique_ptr<TensorSource>> opened = OpenTensorSource(path, o);
    EXPECT_TRUE(opened.ok()) << opened.status().ToString();
    return opened.ok() ? std::move(opened).value() : nullptr;
  }

  ConvertOptions Options(Env* env) {
    ConvertOptions o;
    o.env = env;
    return o;
  }

  // The source's tensors (by name: HDF5 lists them sorted), step, objects and metadata, as a
  // converted copy must have them. A safetensors output adds "format": "pt" for transformers.
  void ExpectSameAsSource(TensorSource& copy, const std::string& metadata = R"({"run":"r1"})") {
    ASSERT_EQ(2u, copy.tensors().size());
    for (size_t i = 0; i < 2; ++i) {
      const SourceTensor& t = copy.tensors()[i];
      const TestTensor& expected = t.name == "w" ? w_ : b_;
      EXPECT_EQ(expected.name, t.name);
      EXPECT_EQ(expected.shape, t.shape);
      EXPECT_EQ(expected.bytes, ReadWhole(copy, i)) << t.name;
    }
    EXPECT_EQ(5u, copy.step().value_or(0));
    ASSERT_EQ(1u, copy.objects().size());
    EXPECT_EQ(1u, copy.objects()[0].rank);
    EXPECT_EQ("rng", copy.objects()[0].name);
    EXPECT_EQ("obj", copy.ReadObject(0).value_or(""));
    EXPECT_EQ(metadata, copy.metadata_json());
  }
  static constexpr char kWithFormat[] = R"({"format":"pt","run":"r1"})";

  const TestTensor w_ = F32Tensor("w", {6, 4}, 0);
  const TestTensor b_ = F32Tensor("b", {3}, 50);
  std::unique_ptr<MemEnv> mem_ = NewMemEnv();
  std::unique_ptr<TensorSource> source_;
};

TEST_F(ConvertTest, SafetensorsToLifelineAndBackInMemory) {
  ConvertOptions o = Options(mem_.get());
  o.ranks = 2;
  o.tp = 2;
  o.memory_budget = 1 << 20;
  uint64_t progressed = 0;
  o.progress = [&](const std::string&, uint64_t bytes) { progressed += bytes; };
  Result<ConvertReport> lifeline = Convert(*source_, ConvertFormat::kLifeline, "/ckpt", o);
  ASSERT_TRUE(lifeline.ok()) << lifeline.status().ToString();
  EXPECT_EQ(5u, lifeline->step);
  EXPECT_EQ(2u, lifeline->ranks);
  EXPECT_EQ(2u, lifeline->tp);
  EXPECT_EQ(1u, lifeline->dp);
  EXPECT_EQ("generic", lifeline->placement);
  EXPECT_EQ(2u, lifeline->tensors);
  EXPECT_EQ(1u, lifeline->objects);
  // w is split in two row halves, b (3 rows >= tp 2) too: every byte read once.
  EXPECT_EQ(w_.bytes.size() + b_.bytes.size(), lifeline->bytes);
  EXPECT_EQ(lifeline->bytes, progressed);
  ASSERT_EQ(1u, lifeline->outputs.size());

  std::unique_ptr<TensorSource> ckpt = Open("/ckpt", mem_.get());
  ASSERT_NE(nullptr, ckpt);
  ExpectSameAsSource(*ckpt);

  // And back to safetensors, one file then shards with an index.
  ASSERT_TRUE(mem_->CreateDir("/out").ok());
  Result<ConvertReport> single = Convert(*ckpt, ConvertFormat::kSafetensors, "/out/one.safetensors", Options(mem_.get()));
  ASSERT_TRUE(single.ok()) << single.status().ToString();
  EXPECT_EQ(std::vector<std::string>{"/out/one.safetensors"}, single->outputs);
  std::unique_ptr<TensorSource> again = Open("/out/one.safetensors", mem_.get());
  ASSERT_NE(nullptr, again);
  ExpectSameAsSource(*again, kWithFormat);

  ConvertOptions sharded = Options(mem_.get());
  sharded.max_shard_bytes = w_.bytes.size();
  Result<ConvertReport> shards = Convert(*ckpt, ConvertFormat::kSafetensors, "/out/sharded", sharded);
  ASSERT_TRUE(shards.ok()) << shards.status().ToString();
  EXPECT_EQ((std::vector<std::string>{"/out/sharded/model-00001-of-00002.safetensors",
                                      "/out/sharded/model-00002-of-00002.safetensors",
                                      "/out/sharded/model.safetensors.index.json"}),
            shards->outputs);
  std::unique_ptr<TensorSource> from_shards = Open("/out/sharded", mem_.get());
  ASSERT_NE(nullptr, from_shards);
  ExpectSameAsSource(*from_shards, kWithFormat);
}

TEST_F(ConvertTest, SelectKeepsTheNamedTensorsOnly) {
  ConvertOptions o = Options(mem_.get());
  o.select = {"b"};
  EXPECT_EQ(std::vector<size_t>{1}, SelectTensors(*source_, o.select));
  Result<ConvertReport> r = Convert(*source_, ConvertFormat::kSafetensors, "/sel.safetensors", o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::unique_ptr<TensorSource> out = Open("/sel.safetensors", mem_.get());
  ASSERT_NE(nullptr, out);
  ASSERT_EQ(1u, out->tensors().size());
  EXPECT_EQ("b", out->tensors()[0].name);
}

TEST_F(ConvertTest, AnExistingOutputIsKeptUnlessForced) {
  ASSERT_TRUE(WriteFileAtomically(mem_.get(), "/taken.safetensors", "mine").ok());
  Result<ConvertReport> r = Convert(*source_, ConvertFormat::kSafetensors, "/taken.safetensors", Options(mem_.get()));
  EXPECT_EQ(StatusCode::kAlreadyExists, r.status().code()) << r.status().ToString();
  EXPECT_TRUE(StatusMentions(r.status(), "/taken.safetensors")) << r.status().ToString();
  EXPECT_EQ("mine", ReadFileToString(mem_.get(), "/taken.safetensors", 100).value_or(""));

  ConvertOptions force = Options(mem_.get());
  force.force = true;
  ASSERT_TRUE(Convert(*source_, ConvertFormat::kSafetensors, "/taken.safetensors", force).ok());
  std::unique_ptr<TensorSource> out = Open("/taken.safetensors", mem_.get());
  ASSERT_NE(nullptr, out);
  ExpectSameAsSource(*out, kWithFormat);
}

TEST_F(ConvertTest, OptionsThatDoNotApplyAreRefused) {
  ConvertOptions o = Options(mem_.get());
  o.max_shard_bytes = 1 << 20;
  Result<ConvertReport> r = Convert(*source_, ConvertFormat::kSafetensors, "/one.safetensors", o);
  EXPECT_EQ(StatusCode::kInvalidArgument, r.status().code()) << r.status().ToString();

  ConvertOptions layout = Options(mem_.get());
  layout.ranks = 4;
  layout.tp = 3;
  r = Convert(*source_, ConvertFormat::kLifeline, "/ckpt", layout);
  EXPECT_EQ(StatusCode::kInvalidArgument, r.status().code()) << r.status().ToString();
  EXPECT_FALSE(mem_->FileExists("/ckpt"));

  EXPECT_EQ(ConvertFormat::kHdf5, ParseConvertFormat("hdf5").value_or(ConvertFormat::kLifeline));
  EXPECT_EQ("safetensors", ConvertFormatName(ParseConvertFormat("safetensors").value_or(ConvertFormat::kHdf5)));
  EXPECT_EQ(StatusCode::kInvalidArgument, ParseConvertFormat("npz").status().code());

  // HDF5 is written by libhdf5 itself: not through an Env other than the POSIX one.
  r = Convert(*source_, ConvertFormat::kHdf5, "/x.h5", Options(mem_.get()));
  EXPECT_EQ(StatusCode::kNotSupported, r.status().code()) << r.status().ToString();
}

TEST_F(ConvertTest, AFailedWriteLeavesNoSafetensorsOutputAndNamesTheFile) {
  ASSERT_TRUE(mem_->CreateDir("/out").ok());
  FaultInjectionEnv faulty(mem_.get());
  faulty.FailWritesAfterBytes(64);  // the file fails partway
  Result<ConvertReport> r = Convert(*source_, ConvertFormat::kSafetensors, "/out/model.safetensors", Options(&faulty));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(StatusMentions(r.status(), "/out/model.safetensors")) << r.status().ToString();
  EXPECT_TRUE(StatusMentions(r.status(), "No space left on device")) << r.status().ToString();
  EXPECT_FALSE(mem_->FileExists("/out/model.safetensors"));
  EXPECT_FALSE(AnyTempFile(mem_.get(), "/out"));

  // Shards: the second file's rename fails; the first is not left behind either.
  faulty.FailWritesAfterBytes(-1);
  faulty.RestrictToPathsContaining("model-00002");
  faulty.FailRenames(true);
  ConvertOptions sharded = Options(&faulty);
  sharded.max_shard_bytes = w_.bytes.size();
  r = Convert(*source_, ConvertFormat::kSafetensors, "/out/sharded", sharded);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(StatusMentions(r.status(), "model-00002-of-00002.safetensors")) << r.status().ToString();
  Result<std::vector<std::string>> left = mem_->GetChildren("/out/sharded");
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left->empty()) << left->front();
}

TEST_F(ConvertTest, AFailedWriteMidCheckpointPublishesNoStepAndNamesTheFile) {
  FaultInjectionEnv faulty(mem_.get());
  faulty.FailWritesAfterBytes(32);
  ConvertOptions o = Options(&faulty);
  o.ranks = 2;
  Result<ConvertReport> r = Convert(*source_, ConvertFormat::kLifeline, "/ckpt", o);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(StatusMentions(r.status(), "/ckpt/step-")) << r.status().ToString();
  // No complete step: nothing a load would find.
  SourceOptions so;
  so.env = mem_.get();
  Result<std::unique_ptr<TensorSource>> opened = OpenTensorSource("/ckpt", so);
  EXPECT_FALSE(opened.ok());

  // The same conversion once the disk has room again publishes the step.
  faulty.FailWritesAfterBytes(-1);
  ASSERT_TRUE(Convert(*source_, ConvertFormat::kLifeline, "/ckpt", o).ok());
  std::unique_ptr<TensorSource> ckpt = Open("/ckpt", mem_.get());
  ASSERT_NE(nullptr, ckpt);
  ExpectSameAsSource(*ckpt);
}

TEST_F(ConvertTest, Hdf5RoundTripOnDisk) {
  TempDir dir;
  const std::string st = dir.Sub("model.safetensors");
  ASSERT_TRUE(WriteWholeFile(
      st, SafetensorsBytes({w_, b_}, {{"lifeline_step", "5"}, {"lifeline_object.1.rng", "b2Jq"}, {"run", "r1"}})));
  std::unique_ptr<TensorSource> disk = Open(st, nullptr);
  ASSERT_NE(nullptr, disk);
  ConvertOptions o;
  o.deflate_level = 4;
  Result<ConvertReport> r = Convert(*disk, ConvertFormat::kHdf5, dir.Sub("model.h5"), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(std::vector<std::string>{dir.Sub("model.h5")}, r->outputs);
  std::unique_ptr<TensorSource> h5 = Open(dir.Sub("model.h5"), nullptr);
  ASSERT_NE(nullptr, h5);
  EXPECT_EQ(SourceKind::kHdf5, h5->kind());
  ExpectSameAsSource(*h5);

  o.deflate_level = 10;
  r = Convert(*disk, ConvertFormat::kHdf5, dir.Sub("other.h5"), o);
  EXPECT_EQ(StatusCode::kInvalidArgument, r.status().code()) << r.status().ToString();
}

// --rename and --dtype on the way to sharded safetensors (what a Hugging Face upload is) and to a
// checkpoint: new names in the files and the index, bf16 values rounded as CastElements does,
// the index's total_size in the output's bytes, and the report listing every change.
TEST_F(ConvertTest, RenamedAndCastToShardedSafetensorsAndToACheckpoint) {
  const TestTensor steps{"steps", DType::kI64, {2}, std::string("\x07\0\0\0\0\0\0\0\x09\0\0\0\0\0\0\0", 16)};
  WriteSafetensors(mem_.get(), "/in2/model.safetensors", {w_, b_, steps});
  std::unique_ptr<TensorSource> source = Open("/in2/model.safetensors", mem_.get());
  ASSERT_NE(nullptr, source);
  ConvertOptions o = Options(mem_.get());
  o.rename = {ParseRenameRule("w=model.weight").value(), ParseRenameRule("(b)=model.$1ias").value()};
  o.dtype = DType::kBF16;
  o.max_shard_bytes = 24;  // w alone (48 bytes as bf16), then b and steps
  o.memory_budget = 1;     // the smallest slabs
  Result<ConvertReport> r = Convert(*source, ConvertFormat::kSafetensors, "/hf", o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(2u, r->renamed.size());
  EXPECT_EQ("w", r->renamed[0].source_name);
  EXPECT_EQ("model.weight", r->renamed[0].name);
  EXPECT_EQ("model.bias", r->renamed[1].name);
  ASSERT_EQ(2u, r->cast.size());  // steps (i64) is not cast
  EXPECT_EQ(DType::kF32, r->cast[0].source_dtype);
  EXPECT_EQ(DType::kBF16, r->cast[0].dtype);
  const uint64_t written = (24 + 3) * 2 + 16;
  EXPECT_EQ(written, r->bytes);
  EXPECT_EQ((std::vector<std::string>{"/hf/model-00001-of-00002.safetensors", "/hf/model-00002-of-00002.safetensors",
                                      "/hf/model.safetensors.index.json"}),
            r->outputs);
  Result<std::string> index_text = ReadFileToString(mem_.get(), "/hf/model.safetensors.index.json", 1 << 20);
  ASSERT_TRUE(index_text.ok());
  Result<format::SafetensorsIndex> index = format::ParseSafetensorsIndex(*index_text, "index");
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(written, index->total_size);
  EXPECT_EQ((std::vector<std::pair<std::string, std::string>>{{"model.weight", "model-00001-of-00002.safetensors"},
                                                              {"model.bias", "model-00002-of-00002.safetensors"},
                                                              {"steps", "model-00002-of-00002.safetensors"}}),
            index->weight_map);

  std::unique_ptr<TensorSource> hf = Open("/hf", mem_.get());
  ASSERT_NE(nullptr, hf);
  ASSERT_EQ(3u, hf->tensors().size());
  for (size_t i = 0; i < 3; ++i) {
    const SourceTensor& t = hf->tensors()[i];
    const TestTensor& original = t.name == "model.weight" ? w_ : t.name == "model.bias" ? b_ : steps;
    if (t.name == "steps") {
      EXPECT_EQ(DType::kI64, t.dtype);
      EXPECT_EQ(steps.bytes, ReadWhole(*hf, i));
      continue;
    }
    EXPECT_EQ(DType::kBF16, t.dtype) << t.name;
    EXPECT_EQ(original.shape, t.shape) << t.name;
    // The test values are small integers: exact in bf16, the upper halves of their f32 bits.
    std::string expected;
    for (size_t k = 0; k < original.bytes.size(); k += 4) expected += original.bytes.substr(k + 2, 2);
    EXPECT_EQ(expected, ReadWhole(*hf, i)) << t.name;
  }

  // The same changes into a checkpoint of 2 ranks.
  ConvertOptions to_ckpt = o;
  to_ckpt.max_shard_bytes = 0;
  to_ckpt.ranks = 2;
  to_ckpt.tp = 2;
  to_ckpt.memory_budget = 1 << 20;
  r = Convert(*source, ConvertFormat::kLifeline, "/ckpt2", to_ckpt);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(2u, r->cast.size());
  std::unique_ptr<TensorSource> ckpt = Open("/ckpt2", mem_.get());
  ASSERT_NE(nullptr, ckpt);
  ASSERT_EQ(3u, ckpt->tensors().size());
  for (size_t i = 0; i < 3; ++i) {
    const SourceTensor& t = ckpt->tensors()[i];
    size_t same = 0;
    while (hf->tensors()[same].name != t.name) ++same;
    EXPECT_EQ(hf->tensors()[same].dtype, t.dtype) << t.name;
    EXPECT_EQ(ReadWhole(*hf, same), ReadWhole(*ckpt, i)) << t.name;
  }
}

TEST_F(ConvertTest, ARenameThatCollidesWritesNothing) {
  ConvertOptions o = Options(mem_.get());
  o.rename = {ParseRenameRule(".*=same").value()};
  Result<ConvertReport> r = Convert(*source_, ConvertFormat::kSafetensors, "/collide", o);
  EXPECT_EQ(StatusCode::kInvalidArgument, r.status().code());
  EXPECT_TRUE(StatusMentions(r.status(), "'w' and 'b'")) << r.status().ToString();
  EXPECT_FALSE(mem_->FileExists("/collide"));
  o.rename.clear();
  o.dtype = DType::kI32;
  r = Convert(*source_, ConvertFormat::kLifeline, "/collide", o);
  EXPECT_EQ(StatusCode::kInvalidArgument, r.status().code());
  EXPECT_TRUE(StatusMentions(r.status(), "'w'")) << r.status().ToString();
  EXPECT_FALSE(mem_->FileExists("/collide"));
}

TEST(TargetShardsTest, GenericPlacementSplitsRowsOverTensorParallelRanks) {
  const std::vector<SourceTensor> tensors = {{"big", DType::kF32, {5, 3}}, {"short", DType::kF32, {1}},
                                             {"scalar", DType::kI64, {}}};
  ParallelLayout layout;
  layout.tp = 2;
  layout.dp = 2;
  bool synthetic = true;
  // Rank 1 is tensor-parallel index 1 of data-parallel group 0; rank 2 index 0 of group 1.
  std::vector<TensorShard> r1 = TargetShards(tensors, "", layout, 1, &synthetic);
  EXPECT_FALSE(synthetic);
  ASSERT_EQ(3u, r1.size());
  EXPECT_EQ("big", r1[0].name);
  EXPECT_EQ((std::vector<int64_t>{3, 0}), r1[0].offsets);
  EXPECT_EQ((std::vector<int64_t>{2, 3}), r1[0].shape);
  EXPECT_EQ((std::vector<int64_t>{1}), r1[1].shape);  // shorter than tp: whole
  std::vector<TensorShard> r2 = TargetShards(tensors, "", layout, 2, &synthetic);
  EXPECT_EQ((std::vector<int64_t>{0, 0}), r2[0].offsets);
  EXPECT_EQ((std::vector<int64_t>{3, 3}), r2[0].shape);
}

}  // namespace convert_test
}  // namespace lifeline::test
