#include "lib/src/convert/hdf5_file.h"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace lifeline {
namespace hdf5_file_test {

constexpr DType kAllDTypes[] = {DType::kF64,    DType::kF32,    DType::kF16, DType::kBF16,
                                DType::kF8E4M3, DType::kF8E5M2, DType::kI64, DType::kI32,
                                DType::kI16,    DType::kI8,     DType::kU8,  DType::kBool};

class Hdf5FileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string base = ::testing::TempDir();
    if (base.empty() || base.back() != '/') base += '/';
    std::string tmpl = base + "hdf5_file_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
};

int64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFileBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Elements of `t` that mean something: finite floats, all integer bit patterns, 0/1 bools.
std::vector<uint8_t> Pattern(DType t, int64_t n, uint32_t seed) {
  const size_t es = DTypeSize(t);
  std::vector<uint8_t> v(static_cast<size_t>(n) * es);
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < n; ++i) {
    uint8_t* p = v.data() + static_cast<size_t>(i) * es;
    switch (t) {
      case DType::kF64: {
        double x = static_cast<double>(static_cast<int32_t>(rng())) / 1024.0;
        std::memcpy(p, &x, 8);
        break;
      }
      case DType::kF32: {
        float x = static_cast<float>(static_cast<int32_t>(rng() % 200001) - 100000) / 64.0f;
        std::memcpy(p, &x, 4);
        break;
      }
      case DType::kF16: {  // finite normal half floats of both signs
        uint32_t r = rng();
        uint16_t bits = static_cast<uint16_t>(((r >> 16) & 1) << 15 | ((r % 30) + 1) << 10 | ((r >> 5) & 0x3FF));
        std::memcpy(p, &bits, 2);
        break;
      }
      case DType::kBool: p[0] = rng() % 3 == 0 ? 1 : 0; break;
      default:
        for (size_t b = 0; b < es; ++b) p[b] = static_cast<uint8_t>(rng());
    }
  }
  return v;
}

std::string HexBytes(const uint8_t* p, size_t n) {
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += kHex[p[i] >> 4];
    s += kHex[p[i] & 15];
  }
  return s;
}

bool Contains(const Status& s, const std::string& needle) {
  return s.message().find(needle) != std::string::npos;
}

// ---- DecomposeFlatRange ----

TEST(DecomposeFlatRangeTest, CoversExactlyTheRangeInOrderWithAtMost2NMinus1Boxes) {
  const std::vector<std::vector<int64_t>> shapes = {{7}, {3, 4}, {2, 3, 4}, {3, 1, 2, 5}, {2, 2, 2, 2, 2}, {1, 1, 6}};
  for (const auto& shape : shapes) {
    int64_t total = 1;
    for (int64_t d : shape) total *= d;
    const size_t rank = shape.size();
    for (int64_t b = 0; b <= total; ++b) {
      for (int64_t e = b; e <= total; ++e) {
        std::vector<FlatRangeBox> boxes = DecomposeFlatRange(shape, b, e);
        ASSERT_LE(boxes.size(), 2 * rank - 1) << "range [" << b << "," << e << ")";
        int64_t next = b;
        for (const FlatRangeBox& box : boxes) {
          ASSERT_EQ(box.start.size(), rank);
          ASSERT_EQ(box.count.size(), rank);
          // Enumerate the box in row-major order; each element must be the next flat index.
          std::vector<int64_t> idx(rank, 0);
          int64_t n = 1;
          for (int64_t c : box.count) n *= c;
          ASSERT_GT(n, 0);
          for (int64_t k = 0; k < n; ++k) {
            int64_t flat = 0;
            for (size_t d = 0; d < rank; ++d) {
              ASSERT_LT(box.start[d] + idx[d], shape[d]);
              flat = flat * shape[d] + box.start[d] + idx[d];
            }
            ASSERT_EQ(flat, next) << "range [" << b << "," << e << ")";
            ++next;
            for (size_t d = rank; d-- > 0;) {
              if (++idx[d] < box.count[d]) break;
              idx[d] = 0;
            }
          }
        }
        ASSERT_EQ(next, e) << "range [" << b << "," << e << ")";
      }
    }
  }
}

TEST(DecomposeFlatRangeTest, ScalarAndEmpty) {
  EXPECT_EQ(DecomposeFlatRange({}, 0, 1).size(), 1u);
  EXPECT_TRUE(DecomposeFlatRange({}, 0, 0).empty());
  EXPECT_TRUE(DecomposeFlatRange({3, 0, 2}, 0, 0).empty());
  EXPECT_EQ(DecomposeFlatRange({4, 5}, 0, 20).size(), 1u);  // the whole box is one box
}

// ---- region round trips ----

class Hdf5RegionTest : public Hdf5FileTest, public ::testing::WithParamInterface<int> {};

// A 5x7x9 box at offset (2,1,3) of an 8x10x12 dataset, written as unaligned flat pieces with tiny
// chunks (so pieces straddle chunk borders), read back as other unaligned pieces and whole.
TEST_P(Hdf5RegionTest, EveryDTypeRoundTripsThroughUnalignedFlatPieces) {
  const int deflate = GetParam();
  const std::vector<int64_t> dims = {8, 10, 12};
  const std::vector<int64_t> offsets = {2, 1, 3};
  const std::vector<int64_t> box = {5, 7, 9};
  const int64_t box_n = 5 * 7 * 9;
  const std::string path = Path("regions.h5");
  std::map<DType, std::vector<uint8_t>> written;
  {
    auto f = Hdf5File::Create(path);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    uint32_t seed = 1;
    for (DType t : kAllDTypes) {
      const std::string name = "tensors/" + std::string(DTypeName(t));
      ASSERT_TRUE(f->CreateDataset(name, t, dims, DatasetOptions{.chunk_bytes = 100, .deflate_level = deflate}).ok());
      std::vector<uint8_t> data = Pattern(t, box_n, seed++);
      const size_t es = DTypeSize(t);
      const int64_t cuts[] = {0, 13, 77, 78, 200, box_n};
      for (size_t i = 0; i + 1 < std::size(cuts); ++i) {
        Status s = f->WriteRegion(name, offsets, box, cuts[i], cuts[i + 1], data.data() + cuts[i] * es);
        ASSERT_TRUE(s.ok()) << s.ToString();
      }
      written[t] = std::move(data);
    }
    ASSERT_TRUE(f->Close().ok());
  }
  auto f = Hdf5File::OpenReadOnly(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  for (DType t : kAllDTypes) {
    SCOPED_TRACE(std::string(DTypeName(t)));
    const std::string name = "tensors/" + std::string(DTypeName(t));
    const size_t es = DTypeSize(t);
    const std::vector<uint8_t>& data = written[t];
    auto info = f->Describe(name);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_EQ(info->dtype, t);
    EXPECT_EQ(info->shape, dims);
    const std::vector<std::pair<int64_t, int64_t>> reads = {{0, box_n}, {5, 300}, {64, 65}, {100, 190}, {314, 315}};
    for (auto [b, e] : reads) {
      std::vector<uint8_t> got(static_cast<size_t>(e - b) * es, 0xAA);
      Status s = f->ReadRegion(name, offsets, box, b, e, got.data());
      ASSERT_TRUE(s.ok()) << s.ToString();
      ASSERT_EQ(HexBytes(got.data(), got.size()), HexBytes(data.data() + b * es, got.size())) << b << ".." << e;
    }
    // The whole dataset: the box holds the data, the rest reads as zero.
    std::vector<uint8_t> all(8 * 10 * 12 * es, 0xAA);
    ASSERT_TRUE(f->ReadAll(name, all.data(), all.size()).ok());
    for (int64_t i = 0; i < 8; ++i)
      for (int64_t j = 0; j < 10; ++j)
        for (int64_t k = 0; k < 12; ++k) {
          const uint8_t* got = all.data() + ((i * 10 + j) * 12 + k) * es;
          bool inside = i >= 2 && i < 7 && j >= 1 && j < 8 && k >= 3 && k < 12;
          std::vector<uint8_t> want(es, 0);
          if (inside) {
            int64_t flat = ((i - 2) * 7 + (j - 1)) * 9 + (k - 3);
            std::memcpy(want.data(), data.data() + flat * es, es);
          }
          ASSERT_EQ(HexBytes(got, es), HexBytes(want.data(), es)) << i << "," << j << "," << k;
        }
  }
}

INSTANTIATE_TEST_SUITE_P(DeflateOffAndOn, Hdf5RegionTest, ::testing::Values(0, 5));

TEST_F(Hdf5FileTest, ScalarTensors) {
  const std::string path = Path("scalar.h5");
  {
    auto f = Hdf5File::Create(path);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f->CreateDataset("step", DType::kI64, {}).ok());
    int64_t step = 123456789012;
    ASSERT_TRUE(f->WriteAll("step", &step, sizeof(step)).ok());
    ASSERT_TRUE(f->CreateDataset("lr", DType::kF32, {}, DatasetOptions{.deflate_level = 9}).ok());
    float lr = 3e-4f;
    ASSERT_TRUE(f->WriteRegion("lr", {}, {}, 0, 1, &lr).ok());
    ASSERT_TRUE(f->CreateDataset("flag", DType::kBool, {}).ok());
    uint8_t flag = 1;
    ASSERT_TRUE(f->WriteAll("flag", &flag, 1).ok());
    // A 0-d box has exactly one element.
    EXPECT_EQ(f->WriteRegion("lr", {}, {}, 0, 2, &lr).code(), StatusCode::kInvalidArgument);
    ASSERT_TRUE(f->Close().ok());
  }
  auto f = Hdf5File::OpenReadOnly(path);
  ASSERT_TRUE(f.ok());
  auto info = f->Describe("step");
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->shape.empty());
  EXPECT_EQ(info->num_elements(), 1);
  int64_t step = 0;
  ASSERT_TRUE(f->ReadAll("step", &step, sizeof(step)).ok());
  EXPECT_EQ(step, 123456789012);
  float lr = 0;
  ASSERT_TRUE(f->ReadRegion("/lr", {}, {}, 0, 1, &lr).ok());
  EXPECT_EQ(lr, 3e-4f);
  uint8_t flag = 7;
  ASSERT_TRUE(f->ReadAll("flag", &flag, 1).ok());
  EXPECT_EQ(flag, 1);
}

TEST_F(Hdf5FileTest, ZeroSizeTensors) {
  const std::string path = Path("empty.h5");
  {
    auto f = Hdf5File::Create(path);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f->CreateDataset("e", DType::kBF16, {3, 0, 4}, DatasetOptions{.deflate_level = 3}).ok());
    ASSERT_TRUE(f->WriteAll("e", nullptr, 0).ok());
    ASSERT_TRUE(f->WriteRegion("e", {1, 0, 0}, {2, 0, 4}, 0, 0, nullptr).ok());
    Status s = f->WriteRegion("e", {0, 0, 0}, {3, 0, 4}, 0, 1, "xx");
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    ASSERT_TRUE(f->CreateDataset("v", DType::kF64, {0}).ok());
    ASSERT_TRUE(f->Close().ok());
  }
  auto f = Hdf5File::OpenReadOnly(path);
  ASSERT_TRUE(f.ok());
  auto info = f->Describe("e");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->dtype, DType::kBF16);
  EXPECT_EQ(info->shape, (std::vector<int64_t>{3, 0, 4}));
  EXPECT_EQ(info->num_elements(), 0);
  EXPECT_TRUE(f->ReadAll("e", nullptr, 0).ok());
  auto v = f->Describe("v");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->shape, (std::vector<int64_t>{0}));
}

TEST_F(Hdf5FileTest, DeflateMakesCompressibleDataSmallerAndStillRoundTrips) {
  const std::vector<int64_t> shape = {256, 512};
  std::vector<float> data(256 * 512);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i % 16) * 0.5f;
  int64_t sizes[2];
  for (int deflate : {0, 6}) {
    const std::string path = Path("deflate" + std::to_string(deflate) + ".h5");
    {
      auto f = Hdf5File::Create(path);
      ASSERT_TRUE(f.ok());
      const DatasetOptions opts{.chunk_bytes = 64 << 10, .deflate_level = deflate};
      ASSERT_TRUE(f->CreateDataset("w", DType::kF32, shape, opts).ok());
      // Two flat halves that do not fall on chunk borders.
      const int64_t mid = 70001;
      ASSERT_TRUE(f->WriteRegion("w", {0, 0}, shape, 0, mid, data.data()).ok());
      ASSERT_TRUE(f->WriteRegion("w", {0, 0}, shape, mid, 256 * 512, data.data() + mid).ok());
      ASSERT_TRUE(f->Close().ok());
    }
    sizes[deflate == 0 ? 0 : 1] = FileSize(path);
    auto f = Hdf5File::OpenReadOnly(path);
    ASSERT_TRUE(f.ok());
    std::vector<float> got(data.size(), -1);
    ASSERT_TRUE(f->ReadAll("w", got.data(), got.size() * 4).ok());
    EXPECT_EQ(got, data);
  }
  EXPECT_GE(sizes[0], 256 * 512 * 4);
  EXPECT_LT(sizes[1] * 10, sizes[0]) << "deflate " << sizes[1] << " vs plain " << sizes[0];
}

TEST_F(Hdf5FileTest, StringAttributes) {
  const std::string path = Path("attrs.h5");
  {
    auto f = Hdf5File::Create(path);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f->CreateDataset("tensors/w", DType::kBF16, {2}).ok());
    ASSERT_TRUE(f->SetStringAttribute("/", "run_id", "run-1").ok());
    ASSERT_TRUE(f->SetStringAttribute("/", "run_id", "run-2").ok());  // replaced
    ASSERT_TRUE(f->SetStringAttribute("/", "metadata_json", "{\"lr\": 0.1, \"name\": \"h\xC3\xA9llo\"}").ok());
    ASSERT_TRUE(f->SetStringAttribute("/", "empty", "").ok());
    ASSERT_TRUE(f->SetStringAttribute("tensors", "kind", "group").ok());
    ASSERT_TRUE(f->SetStringAttribute("tensors/w", "source", "rank 3").ok());
    EXPECT_EQ(f->SetStringAttribute("nope", "k", "v").code(), StatusCode::kNotFound);
    EXPECT_EQ(f->SetStringAttribute("/", "", "v").code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(f->SetStringAttribute("/", "k", std::string("a\0b", 3)).code(), StatusCode::kInvalidArgument);
    ASSERT_TRUE(f->Close().ok());
  }
  auto f = Hdf5File::OpenReadOnly(path);
  ASSERT_TRUE(f.ok());
  auto run = f->GetStringAttribute("/", "run_id");
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->value_or("?"), "run-2");
  auto missing = f->GetStringAttribute("/", "nothing");
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->has_value());
  auto empty = f->GetStringAttribute("/", "empty");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->value_or("?"), "");
  auto root = f->StringAttributes("/");
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(*root, (std::vector<std::pair<std::string, std::string>>{
                       {"empty", ""},
                       {"metadata_json", "{\"lr\": 0.1, \"name\": \"h\xC3\xA9llo\"}"},
                       {"run_id", "run-2"}}));
  auto group = f->StringAttributes("tensors");
  ASSERT_TRUE(group.ok());
  EXPECT_EQ(*group, (std::vector<std::pair<std::string, std::string>>{{"kind", "group"}}));
  auto ds = f->StringAttributes("tensors/w");
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ(*ds, (std::vector<std::pair<std::string, std::string>>{{"lifeline_dtype", "bf16"}, {"source", "rank 3"}}));
  auto nf = f->GetStringAttribute("tensors/x", "k");
  EXPECT_EQ(nf.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(nf.status(), "tensors/x")) << nf.status().ToString();
  EXPECT_EQ(f->SetStringAttribute("/", "k", "v").code(), StatusCode::kFailedPrecondition);  // read-only
}

TEST_F(Hdf5FileTest, ByteBlobs) {
  const std::string path = Path("bytes.h5");
  const std::string blob("rng\0state\xff\x01", 12);
  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 31 + (i >> 9));
  {
    auto f = Hdf5File::Create(path);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f->WriteBytes("objects/rank0/rng", blob).ok());
    ASSERT_TRUE(f->WriteBytes("objects/rank1/empty", "").ok());
    ASSERT_TRUE(f->WriteBytes("objects/rank1/big", big).ok());
    EXPECT_EQ(f->WriteBytes("objects/rank0/rng", "again").code(), StatusCode::kAlreadyExists);
    ASSERT_TRUE(f->CreateDataset("t", DType::kF32, {3}).ok());
    ASSERT_TRUE(f->Close().ok());
  }
  auto f = Hdf5File::OpenReadOnly(path);
  ASSERT_TRUE(f.ok());
  auto got = f->ReadBytes("objects/rank0/rng");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, blob);
  auto empty = f->ReadBytes("objects/rank1/empty");
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ(*empty, "");
  auto big_got = f->ReadBytes("objects/rank1/big");
  ASSERT_TRUE(big_got.ok());
  EXPECT_TRUE(*big_got == big);
  auto wrong = f->ReadBytes("t");
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(wrong.status(), "'t'")) << wrong.status().ToString();
}

// Found by tests/fuzz/hdf5_read_fuzz: a file of a few KiB whose byte string claims a PiB made
// ReadBytes throw std::bad_alloc, and `lifeline convert` die in std::terminate.
TEST_F(Hdf5FileTest, AByteStringLongerThanItsStorageIsCorruptionNotAnException) {
  const std::string path = Path("huge.h5");
  {
    auto f = Hdf5File::Create(path);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f->CreateDataset("objects/rank0/huge", DType::kU8, {int64_t{1} << 50}).ok());  // never written
    ASSERT_TRUE(f->Close().ok());
  }
  auto f = Hdf5File::OpenReadOnly(path);
  ASSERT_TRUE(f.ok());
  auto got = f->ReadBytes("objects/rank0/huge");
  EXPECT_EQ(got.status().code(), StatusCode::kCorruption) << got.status().ToString();
  EXPECT_TRUE(Contains(got.status(), "objects/rank0/huge")) << got.status().ToString();
}

TEST_F(Hdf5FileTest, ListDatasetsIsRecursiveAndSorted) {
  const std::string path = Path("list.h5");
  auto f = Hdf5File::Create(path);
  ASSERT_TRUE(f.ok());
  for (const char* name : {"tensors/model.embed.weight", "tensors/layers/0/w", "tensors/layers/10/w",
                           "objects/rank0/rng", "a/b/c", "z"}) {
    ASSERT_TRUE(f->CreateDataset(name, DType::kF32, {1}).ok()) << name;
  }
  auto all = f->ListDatasets();
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(*all, (std::vector<std::string>{"a/b/c", "objects/rank0/rng", "tensors/layers/0/w",
                                            "tensors/layers/10/w", "tensors/model.embed.weight", "z"}));
  auto tensors = f->ListDatasets("/tensors");
  ASSERT_TRUE(tensors.ok());
  EXPECT_EQ(*tensors, (std::vector<std::string>{"tensors/layers/0/w", "tensors/layers/10/w",
                                                "tensors/model.embed.weight"}));
  auto layers = f->ListDatasets("tensors/layers");
  ASSERT_TRUE(layers.ok());
  EXPECT_EQ(layers->size(), 2u);
  EXPECT_EQ(f->ListDatasets("missing").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(f->ListDatasets("z").status().code(), StatusCode::kInvalidArgument);
  // A dataset cannot be used as a group, and a group is not a dataset.
  Status under = f->CreateDataset("z/inner", DType::kF32, {1});
  EXPECT_EQ(under.code(), StatusCode::kInvalidArgument) << under.ToString();
  auto group = f->Describe("tensors");
  EXPECT_EQ(group.status().code(), StatusCode::kInvalidArgument) << group.status().ToString();
}

TEST_F(Hdf5FileTest, DescribeReportsDTypeShapeAndStoredType) {
  const std::string path = Path("describe.h5");
  {
    auto f = Hdf5File::Create(path);
    ASSERT_TRUE(f.ok());
    for (DType t : kAllDTypes) ASSERT_TRUE(f->CreateDataset(std::string(DTypeName(t)), t, {2, 3}).ok());
    ASSERT_TRUE(f->Close().ok());
  }
  auto f = Hdf5File::OpenReadOnly(path);
  ASSERT_TRUE(f.ok());
  const std::map<DType, std::string> stored = {
      {DType::kF64, "IEEE float64 LE"}, {DType::kF32, "IEEE float32 LE"}, {DType::kF16, "IEEE float16 LE"},
      {DType::kBF16, "uint16 LE"},      {DType::kF8E4M3, "uint8 LE"},     {DType::kF8E5M2, "uint8 LE"},
      {DType::kI64, "int64 LE"},        {DType::kI32, "int32 LE"},        {DType::kI16, "int16 LE"},
      {DType::kI8, "int8 LE"},          {DType::kU8, "uint8 LE"},
      {DType::kBool, "enum over int8 LE {FALSE, TRUE}"}};
  for (DType t : kAllDTypes) {
    auto info = f->Describe(std::string(DTypeName(t)));
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_EQ(info->dtype, t);
    EXPECT_EQ(info->shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(info->stored_type, stored.at(t));
  }
  auto missing = f->Describe("nothing/here");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(missing.status(), "nothing/here"));
}

TEST_F(Hdf5FileTest, CreateDatasetRejectsBadInput) {
  auto f = Hdf5File::Create(Path("bad.h5"));
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(f->CreateDataset("x", DType::kF32, {4}).ok());
  EXPECT_EQ(f->CreateDataset("x", DType::kF32, {4}).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(f->CreateDataset("", DType::kF32, {4}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f->CreateDataset("a//b", DType::kF32, {4}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f->CreateDataset("a/../b", DType::kF32, {4}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f->CreateDataset("n", DType::kF32, {4, -1}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f->CreateDataset("n", static_cast<DType>(99), {4}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f->CreateDataset("n", DType::kF64, {int64_t{1} << 40, int64_t{1} << 30}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(f->CreateDataset("n", DType::kF32, std::vector<int64_t>(33, 1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f->CreateDataset("n", DType::kF32, {4}, DatasetOptions{.deflate_level = 10}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(f->CreateDataset("n", DType::kF32, {4}, DatasetOptions{.chunk_bytes = 0}).code(),
            StatusCode::kInvalidArgument);
  // Huge but representable: chunked layout means no space is allocated until written.
  ASSERT_TRUE(f->CreateDataset("huge", DType::kF32, {int64_t{1} << 20, int64_t{1} << 20}).ok());
  float x = 5;
  ASSERT_TRUE(f->WriteRegion("huge", {12345, 999}, {1, 1}, 0, 1, &x).ok());
  float y = 0;
  ASSERT_TRUE(f->ReadRegion("huge", {12345, 999}, {1, 1}, 0, 1, &y).ok());
  EXPECT_EQ(y, 5);
  ASSERT_TRUE(f->Close().ok());
  EXPECT_LT(FileSize(Path("bad.h5")), 4 << 20);
  EXPECT_EQ(f->CreateDataset("after", DType::kF32, {1}).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(f->Close().ok());  // twice is fine
}

TEST_F(Hdf5FileTest, OutOfBoundsRegionsAreInvalidArgumentNamingTheDataset) {
  auto f = Hdf5File::Create(Path("oob.h5"));
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(f->CreateDataset("tensors/w", DType::kF32, {4, 6}).ok());
  std::vector<float> buf(64);
  struct Case {
    std::vector<int64_t> offsets, shape;
    int64_t b, e;
  };
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  const Case cases[] = {
      {{0, 0}, {5, 6}, 0, 1},             // box taller than the dataset
      {{3, 0}, {2, 6}, 0, 1},             // box ends past the dataset
      {{-1, 0}, {1, 6}, 0, 1},            // negative offset
      {{0, 0}, {2, -3}, 0, 0},            // negative extent
      {{0}, {4}, 0, 1},                   // rank mismatch
      {{0, 0}, {2, 3}, 0, 7},             // range past the box
      {{0, 0}, {2, 3}, 4, 3},             // reversed range
      {{0, 0}, {2, 3}, -1, 2},            // negative range
      {{kMax, kMax}, {kMax, kMax}, 0, 1},  // offset + extent overflows
      {{1, 1}, {kMax, 2}, 0, 1},
  };
  for (const Case& c : cases) {
    Status w = f->WriteRegion("tensors/w", c.offsets, c.shape, c.b, c.e, buf.data());
    EXPECT_EQ(w.code(), StatusCode::kInvalidArgument) << w.ToString();
    EXPECT_TRUE(Contains(w, "'tensors/w'")) << w.ToString();
    EXPECT_TRUE(Contains(w, "offsets [")) << w.ToString();
    Status r = f->ReadRegion("tensors/w", c.offsets, c.shape, c.b, c.e, buf.data());
    EXPECT_EQ(r.code(), StatusCode::kInvalidArgument) << r.ToString();
  }
  EXPECT_EQ(f->WriteRegion("tensors/nope", {0, 0}, {1, 1}, 0, 1, buf.data()).code(), StatusCode::kNotFound);
  // The whole-dataset helpers check the buffer size.
  EXPECT_EQ(f->WriteAll("tensors/w", buf.data(), 23 * 4).code(), StatusCode::kInvalidArgument);
  // Bools must be 0 or 1 in memory.
  ASSERT_TRUE(f->CreateDataset("flags", DType::kBool, {3}).ok());
  const uint8_t flags[3] = {0, 2, 1};
  Status s = f->WriteAll("flags", flags, 3);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
}

TEST_F(Hdf5FileTest, InconsistentLifelineDTypeIsCorruption) {
  const std::string path = Path("inconsistent.h5");
  {
    auto f = Hdf5File::Create(path);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f->CreateDataset("tensors/w", DType::kF32, {4}).ok());
    ASSERT_TRUE(f->SetStringAttribute("tensors/w", "lifeline_dtype", "bf16").ok());
    ASSERT_TRUE(f->CreateDataset("tensors/v", DType::kU8, {4}).ok());
    ASSERT_TRUE(f->SetStringAttribute("tensors/v", "lifeline_dtype", "complex256").ok());
    ASSERT_TRUE(f->CreateDataset("tensors/b", DType::kBF16, {4}).ok());
    ASSERT_TRUE(f->SetStringAttribute("tensors/b", "lifeline_dtype", "f16").ok());
    ASSERT_TRUE(f->Close().ok());
  }
  auto f = Hdf5File::OpenReadOnly(path);
  ASSERT_TRUE(f.ok());
  for (const char* name : {"tensors/w", "tensors/v", "tensors/b"}) {
    auto info = f->Describe(name);
    EXPECT_EQ(info.status().code(), StatusCode::kCorruption) << name << ": " << info.status().ToString();
    EXPECT_TRUE(Contains(info.status(), std::string("'") + name + "'")) << info.status().ToString();
    float out[4];
    EXPECT_EQ(f->ReadAll(name, out, sizeof(out)).code(), StatusCode::kCorruption);
  }
  Status w = f->Describe("tensors/w").status();
  EXPECT_TRUE(Contains(w, "'bf16'") && Contains(w, "IEEE float32")) << w.ToString();
}

// ---- hostile files ----

TEST_F(Hdf5FileTest, NonHdf5AndTruncatedFilesGiveErrorsNamingThePathWithoutPrinting) {
  const std::string good = Path("good.h5");
  {
    auto f = Hdf5File::Create(good);
    ASSERT_TRUE(f.ok());
    std::vector<uint8_t> data = Pattern(DType::kF32, 64 << 10, 7);
    ASSERT_TRUE(f->CreateDataset("t/w", DType::kF32, {64 << 10}).ok());
    ASSERT_TRUE(f->WriteAll("t/w", data.data(), data.size()).ok());
    ASSERT_TRUE(f->SetStringAttribute("/", "run_id", "x").ok());
    ASSERT_TRUE(f->Close().ok());
  }
  const std::string bytes = ReadFileBytes(good);
  ASSERT_GT(bytes.size(), 200000u);

  const std::string text = Path("notes.txt");
  WriteFileBytes(text, "this is not an HDF5 file, just text\n");
  const std::string empty = Path("empty.h5");
  WriteFileBytes(empty, "");
  const std::string half = Path("half.h5");
  WriteFileBytes(half, bytes.substr(0, bytes.size() / 2));
  const std::string head = Path("head.h5");
  WriteFileBytes(head, bytes.substr(0, 100));
  const std::string garbage = Path("garbage.h5");  // a valid signature followed by junk
  WriteFileBytes(garbage, bytes.substr(0, 8) + std::string(4000, '\x5a'));

  ::testing::internal::CaptureStderr();
  ::testing::internal::CaptureStdout();
  for (const std::string& p : {text, empty, half, head, garbage}) {
    auto f = Hdf5File::OpenReadOnly(p);
    ASSERT_FALSE(f.ok()) << p;
    EXPECT_EQ(f.status().code(), StatusCode::kCorruption) << f.status().ToString();
    EXPECT_TRUE(Contains(f.status(), p)) << f.status().ToString();
  }
  auto half_status = Hdf5File::OpenReadOnly(half).status();
  auto missing = Hdf5File::OpenReadOnly(Path("missing.h5"));
  auto dir = Hdf5File::OpenReadOnly(dir_);
  auto uncreatable = Hdf5File::Create(Path("no/such/dir/x.h5"));
  const std::string out = ::testing::internal::GetCapturedStdout();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(out, "");
  EXPECT_EQ(err, "");
  // The innermost HDF5 reason is part of the message.
  EXPECT_TRUE(Contains(half_status, "HDF5: ") && Contains(half_status, "truncated")) << half_status.ToString();
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(missing.status(), "missing.h5"));
  EXPECT_EQ(dir.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(uncreatable.status().code(), StatusCode::kIOError);
  EXPECT_TRUE(Contains(uncreatable.status(), "no/such/dir/x.h5")) << uncreatable.status().ToString();
  EXPECT_TRUE(Contains(uncreatable.status(), "HDF5: ")) << uncreatable.status().ToString();
}

// Files whose datasets pull data from elsewhere on the machine, written with the HDF5 C API: a
// dataset with external raw storage, a virtual dataset, an external link.
class ForeignDataTest : public Hdf5FileTest {
 protected:
  void SetUp() override {
    Hdf5FileTest::SetUp();
    // A file of the machine that the HDF5 files below point to: its bytes must not be read.
    secret_ = Path("secret.bin");
    WriteFileBytes(secret_, std::string(64, 'S'));
    source_ = Path("source.h5");
    hid_t f = H5Fcreate(source_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    const hsize_t dims[1] = {16};
    hid_t space = H5Screate_simple(1, dims, nullptr);
    hid_t d = H5Dcreate2(f, "data", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    std::vector<float> values(16, 42.0f);
    ASSERT_GE(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
    H5Dclose(d);
    H5Sclose(space);
    H5Fclose(f);
  }

  // Creates `path` with one float32 dataset "w" of 16 elements made with `dcpl`.
  void WriteWithCreationProperties(const std::string& path, hid_t dcpl) {
    hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    const hsize_t dims[1] = {16};
    hid_t space = H5Screate_simple(1, dims, nullptr);
    hid_t d = H5Dcreate2(f, "w", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ASSERT_GE(d, 0);
    H5Dclose(d);
    H5Sclose(space);
    H5Fclose(f);
  }

  // Describe and ReadAll of `dataset` in `path` are both refused, naming the dataset and `why`.
  void ExpectRefused(const std::string& path, const std::string& dataset, const std::string& why) {
    auto f = Hdf5File::OpenReadOnly(path);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    Status described = f->Describe(dataset).status();
    EXPECT_EQ(described.code(), StatusCode::kNotSupported) << described.ToString();
    EXPECT_TRUE(Contains(described, "'" + dataset + "'")) << described.ToString();
    EXPECT_TRUE(Contains(described, why)) << described.ToString();
    float out[16] = {};
    Status read = f->ReadAll(dataset, out, sizeof(out));
    EXPECT_EQ(read.code(), StatusCode::kNotSupported) << read.ToString();
    for (float v : out) EXPECT_EQ(v, 0.0f) << "data from outside the file was read";
  }

  std::string secret_;
  std::string source_;
};

TEST_F(ForeignDataTest, ExternalRawStorageIsRefusedNamingTheDataset) {
  const std::string path = Path("external.h5");
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  ASSERT_GE(H5Pset_external(dcpl, secret_.c_str(), 0, 64), 0);
  WriteWithCreationProperties(path, dcpl);
  H5Pclose(dcpl);
  ExpectRefused(path, "w", "external file");
  auto f = Hdf5File::OpenReadOnly(path);
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(Contains(f->Describe("w").status(), secret_)) << "the message should name the external file";
}

TEST_F(ForeignDataTest, AVirtualDatasetIsRefusedNamingTheDataset) {
  const std::string path = Path("virtual.h5");
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  const hsize_t dims[1] = {16};
  hid_t vspace = H5Screate_simple(1, dims, nullptr);
  hid_t sspace = H5Screate_simple(1, dims, nullptr);
  ASSERT_GE(H5Pset_virtual(dcpl, vspace, source_.c_str(), "/data", sspace), 0);
  WriteWithCreationProperties(path, dcpl);
  H5Sclose(vspace);
  H5Sclose(sspace);
  H5Pclose(dcpl);
  ExpectRefused(path, "w", "virtual dataset");
}

TEST_F(ForeignDataTest, AnExternalLinkIsNotFollowed) {
  const std::string path = Path("elink.h5");
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  ASSERT_GE(H5Lcreate_external(source_.c_str(), "/data", f, "w", H5P_DEFAULT, H5P_DEFAULT), 0);
  ASSERT_GE(H5Lcreate_external(source_.c_str(), "/", f, "g", H5P_DEFAULT, H5P_DEFAULT), 0);
  H5Fclose(f);
  ExpectRefused(path, "w", "external link");
  ExpectRefused(path, "g/data", "external link");
  auto opened = Hdf5File::OpenReadOnly(path);
  ASSERT_TRUE(opened.ok());
  auto listed = opened->ListDatasets("/");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_TRUE(listed->empty()) << "external links are not datasets of this file";
}

TEST_F(Hdf5FileTest, MovedFromAndClosedFilesFailCleanly) {
  auto created = Hdf5File::Create(Path("move.h5"));
  ASSERT_TRUE(created.ok());
  Hdf5File a = std::move(created).value();
  ASSERT_TRUE(a.CreateDataset("x", DType::kI32, {2}).ok());
  Hdf5File b = std::move(a);
  // NOLINTNEXTLINE(bugprone-use-after-move): on purpose
  EXPECT_EQ(a.CreateDataset("y", DType::kI32, {2}).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.Describe("x").status().code(), StatusCode::kFailedPrecondition);
  int32_t v[2] = {1, -1};
  ASSERT_TRUE(b.WriteAll("x", v, sizeof(v)).ok());
  EXPECT_EQ(b.path(), Path("move.h5"));
  ASSERT_TRUE(b.Close().ok());
  EXPECT_EQ(b.Describe("x").status().code(), StatusCode::kFailedPrecondition);
  auto r = Hdf5File::OpenReadOnly(Path("move.h5"));
  ASSERT_TRUE(r.ok());
  int32_t got[2] = {0, 0};
  ASSERT_TRUE(r->ReadAll("x", got, sizeof(got)).ok());
  EXPECT_EQ(got[0], 1);
  EXPECT_EQ(got[1], -1);
  EXPECT_EQ(r->WriteAll("x", v, sizeof(v)).code(), StatusCode::kFailedPrecondition);
}

// ---- h5py cross-checks ----

bool HaveH5py() { return std::system("/usr/bin/python3 -c 'import h5py, numpy' >/dev/null 2>&1") == 0; }

// Runs `script` with /usr/bin/python3 and `arg`; returns its exit status and output.
int RunPython(const std::string& dir, const std::string& script, const std::string& arg, std::string* output) {
  const std::string py = dir + "/check.py", log = dir + "/check.log";
  WriteFileBytes(py, script);
  int rc = std::system(("/usr/bin/python3 '" + py + "' '" + arg + "' >'" + log + "' 2>&1").c_str());
  *output = ReadFileBytes(log);
  return rc;
}

constexpr char kReadOurFileScript[] = R"PY(
import sys
import h5py
import numpy as np

f = h5py.File(sys.argv[1], "r")
seen = []

def check(name, dtype, expected, lifeline_dtype):
    d = f[name]
    got = d[()]
    assert d.dtype == np.dtype(dtype), (name, d.dtype, dtype)
    exp = np.array(expected, dtype=dtype)
    assert got.shape == exp.shape, (name, got.shape, exp.shape)
    assert np.array_equal(got, exp), (name, got, exp)
    assert d.attrs["lifeline_dtype"] == lifeline_dtype, (name, d.attrs["lifeline_dtype"])
    seen.append(name)
    print(name, d.dtype, got.tolist())

check("tensors/f64", "<f8", [[-1.0, -0.5, 0.0], [0.5, 1.0, 1.5]], "f64")
check("tensors/f32", "<f4", [-2.0, -0.75, 0.5, 1.75], "f32")
check("tensors/f16", "<f2", [[-2.0, -0.5], [0.25, 65504.0]], "f16")
check("tensors/bf16", "<u2", [0x3F80, 0xC000, 0x0000], "bf16")
check("tensors/f8e4m3", "u1", [0x38, 0xC0], "f8e4m3")
check("tensors/f8e5m2", "u1", [0x3C, 0x00], "f8e5m2")
check("tensors/i64", "<i8", [-5, 0, 1 << 40], "i64")
check("tensors/i32", "<i4", [-7, 123456], "i32")
check("tensors/i16", "<i2", [-300, 300], "i16")
check("tensors/i8", "i1", [-128, 127], "i8")
check("tensors/u8", "u1", [0, 255], "u8")
check("tensors/bool", "?", [True, False, False, True, True], "bool")
check("tensors/scalar", "<f4", 3.5, "f32")
check("tensors/empty", "<f4", np.zeros((0, 4)), "f32")
assert f["tensors/f64"].chunks is not None
assert f["tensors/f32"].compression == "gzip", f["tensors/f32"].compression
blob = f["objects/rank0/rng"][()]
assert blob.dtype == np.uint8 and blob.tobytes() == b"\x00\x01hello", blob
assert f.attrs["run_id"] == "run-7", f.attrs["run_id"]
assert f["tensors"].attrs["note"] == "caf\u00e9", f["tensors"].attrs["note"]
names = []
f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
assert sorted(names) == sorted(seen + ["objects/rank0/rng"]), names
print("OK")
)PY";

TEST_F(Hdf5FileTest, H5pyReadsWhatWeWrite) {
  if (!HaveH5py()) GTEST_SKIP() << "/usr/bin/python3 lacks h5py or numpy";
  const std::string path = Path("ours.h5");
  {
    auto f = Hdf5File::Create(path);
    ASSERT_TRUE(f.ok());
    auto put = [&](const std::string& name, DType t, std::vector<int64_t> shape, const void* data, size_t bytes,
                   int deflate = 0) {
      ASSERT_TRUE(f->CreateDataset(name, t, shape, DatasetOptions{.deflate_level = deflate}).ok()) << name;
      Status s = f->WriteAll(name, data, bytes);
      ASSERT_TRUE(s.ok()) << s.ToString();
    };
    const double f64[] = {-1.0, -0.5, 0.0, 0.5, 1.0, 1.5};
    put("tensors/f64", DType::kF64, {2, 3}, f64, sizeof(f64));
    const float f32[] = {-2.0f, -0.75f, 0.5f, 1.75f};
    put("tensors/f32", DType::kF32, {4}, f32, sizeof(f32), 4);
    const uint16_t f16[] = {0xC000, 0xB800, 0x3400, 0x7BFF};  // -2, -0.5, 0.25, 65504
    put("tensors/f16", DType::kF16, {2, 2}, f16, sizeof(f16));
    const uint16_t bf16[] = {0x3F80, 0xC000, 0x0000};
    put("tensors/bf16", DType::kBF16, {3}, bf16, sizeof(bf16));
    const uint8_t e4m3[] = {0x38, 0xC0}, e5m2[] = {0x3C, 0x00};
    put("tensors/f8e4m3", DType::kF8E4M3, {2}, e4m3, 2);
    put("tensors/f8e5m2", DType::kF8E5M2, {2}, e5m2, 2);
    const int64_t i64[] = {-5, 0, int64_t{1} << 40};
    put("tensors/i64", DType::kI64, {3}, i64, sizeof(i64));
    const int32_t i32[] = {-7, 123456};
    put("tensors/i32", DType::kI32, {2}, i32, sizeof(i32));
    const int16_t i16[] = {-300, 300};
    put("tensors/i16", DType::kI16, {2}, i16, sizeof(i16));
    const int8_t i8[] = {-128, 127};
    put("tensors/i8", DType::kI8, {2}, i8, 2);
    const uint8_t u8[] = {0, 255};
    put("tensors/u8", DType::kU8, {2}, u8, 2);
    const uint8_t flags[] = {1, 0, 0, 1, 1};
    put("tensors/bool", DType::kBool, {5}, flags, 5, 1);
    const float scalar = 3.5f;
    put("tensors/scalar", DType::kF32, {}, &scalar, 4);
    put("tensors/empty", DType::kF32, {0, 4}, nullptr, 0);
    ASSERT_TRUE(f->WriteBytes("objects/rank0/rng", std::string("\x00\x01hello", 7)).ok());
    ASSERT_TRUE(f->SetStringAttribute("/", "run_id", "run-7").ok());
    ASSERT_TRUE(f->SetStringAttribute("tensors", "note", "caf\xC3\xA9").ok());
    ASSERT_TRUE(f->Close().ok());
  }
  std::string output;
  int rc = RunPython(dir_, kReadOurFileScript, path, &output);
  EXPECT_EQ(rc, 0) << output;
  EXPECT_NE(output.find("OK"), std::string::npos) << output;
}

constexpr char kWriteH5pyFileScript[] = R"PY(
import sys
import h5py
import numpy as np

with h5py.File(sys.argv[1], "w") as f:
    f["h16"] = np.array([[1.5, -2.0], [0.0, 65504.0]], dtype=np.float16)
    f["h32"] = np.arange(6, dtype=np.float32).reshape(2, 3) * 0.5
    f["be32"] = np.array([1.0, -2.5], dtype=">f4")
    f["i64"] = np.array([-(2 ** 40), 7, 0], dtype=np.int64)
    f["flags"] = np.array([True, False, True, True])
    f["scalar"] = np.float64(2.25)
    f.create_dataset("g/nested", data=np.arange(12, dtype=np.int8).reshape(3, 4), chunks=(2, 2), compression="gzip")
    f["c64"] = np.array([1 + 2j, 3 - 4j], dtype=np.complex64)
    f["str"] = np.array(["a", "bc"], dtype=h5py.string_dtype())
    f["u16"] = np.array([1, 2], dtype=np.uint16)
    bad = f.create_dataset("bad", data=np.zeros(3, dtype=np.float32))
    bad.attrs["lifeline_dtype"] = "bf16"
    f.attrs["note"] = "h\u00e9llo"
    f.attrs["fixed"] = np.bytes_(b"fixed12")
    f.attrs["count"] = 5
print("OK")
)PY";

TEST_F(Hdf5FileTest, WeReadWhatH5pyWrites) {
  if (!HaveH5py()) GTEST_SKIP() << "/usr/bin/python3 lacks h5py or numpy";
  const std::string path = Path("theirs.h5");
  std::string output;
  ASSERT_EQ(RunPython(dir_, kWriteH5pyFileScript, path, &output), 0) << output;
  auto f = Hdf5File::OpenReadOnly(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();

  auto h16 = f->Describe("h16");
  ASSERT_TRUE(h16.ok()) << h16.status().ToString();
  EXPECT_EQ(h16->dtype, DType::kF16);
  EXPECT_EQ(h16->shape, (std::vector<int64_t>{2, 2}));
  uint16_t half[4];
  ASSERT_TRUE(f->ReadAll("h16", half, sizeof(half)).ok());
  EXPECT_EQ(half[0], 0x3E00);  // 1.5
  EXPECT_EQ(half[1], 0xC000);  // -2
  EXPECT_EQ(half[2], 0x0000);
  EXPECT_EQ(half[3], 0x7BFF);  // 65504

  float h32[6];
  ASSERT_EQ(f->Describe("h32")->dtype, DType::kF32);
  ASSERT_TRUE(f->ReadAll("h32", h32, sizeof(h32)).ok());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(h32[i], 0.5f * static_cast<float>(i));
  // Big-endian on disk, little-endian in memory.
  auto be = f->Describe("be32");
  ASSERT_TRUE(be.ok());
  EXPECT_EQ(be->dtype, DType::kF32);
  EXPECT_EQ(be->stored_type, "IEEE float32 BE");
  float be32[2];
  ASSERT_TRUE(f->ReadRegion("be32", {0}, {2}, 0, 2, be32).ok());
  EXPECT_EQ(be32[0], 1.0f);
  EXPECT_EQ(be32[1], -2.5f);

  int64_t i64[3];
  ASSERT_EQ(f->Describe("i64")->dtype, DType::kI64);
  ASSERT_TRUE(f->ReadAll("i64", i64, sizeof(i64)).ok());
  EXPECT_EQ(i64[0], -(int64_t{1} << 40));
  EXPECT_EQ(i64[1], 7);
  EXPECT_EQ(i64[2], 0);

  auto flags_info = f->Describe("flags");
  ASSERT_TRUE(flags_info.ok()) << flags_info.status().ToString();
  EXPECT_EQ(flags_info->dtype, DType::kBool);
  uint8_t flags[4];
  ASSERT_TRUE(f->ReadAll("flags", flags, 4).ok());
  EXPECT_EQ(HexBytes(flags, 4), "01000101");

  auto scalar = f->Describe("scalar");
  ASSERT_TRUE(scalar.ok());
  EXPECT_EQ(scalar->dtype, DType::kF64);
  EXPECT_TRUE(scalar->shape.empty());
  double d = 0;
  ASSERT_TRUE(f->ReadAll("scalar", &d, 8).ok());
  EXPECT_EQ(d, 2.25);

  int8_t nested[4];  // row 1, columns 1..2 and row 2, columns 1..2 -> a flat piece of a 2x2 box
  ASSERT_TRUE(f->ReadRegion("g/nested", {1, 1}, {2, 2}, 0, 4, nested).ok());
  EXPECT_EQ(nested[0], 5);
  EXPECT_EQ(nested[1], 6);
  EXPECT_EQ(nested[2], 9);
  EXPECT_EQ(nested[3], 10);

  for (const char* name : {"c64", "str", "u16"}) {
    auto info = f->Describe(name);
    EXPECT_EQ(info.status().code(), StatusCode::kNotSupported) << name << ": " << info.status().ToString();
    EXPECT_TRUE(Contains(info.status(), std::string("'") + name + "'")) << info.status().ToString();
  }
  Status c64 = f->Describe("c64").status(), str = f->Describe("str").status();
  EXPECT_TRUE(Contains(c64, "compound {r, i}")) << c64.ToString();
  EXPECT_TRUE(Contains(str, "string (variable-length")) << str.ToString();
  EXPECT_EQ(f->Describe("bad").status().code(), StatusCode::kCorruption);

  auto list = f->ListDatasets();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(*list, (std::vector<std::string>{"bad", "be32", "c64", "flags", "g/nested", "h16", "h32", "i64",
                                             "scalar", "str", "u16"}));

  auto attrs = f->StringAttributes("/");
  ASSERT_TRUE(attrs.ok()) << attrs.status().ToString();
  EXPECT_EQ(*attrs,
            (std::vector<std::pair<std::string, std::string>>{{"fixed", "fixed12"}, {"note", "h\xC3\xA9llo"}}));
  auto count = f->GetStringAttribute("/", "count");
  EXPECT_EQ(count.status().code(), StatusCode::kInvalidArgument) << count.status().ToString();
  auto fixed = f->GetStringAttribute("/", "fixed");
  ASSERT_TRUE(fixed.ok());
  EXPECT_EQ(fixed->value_or("?"), "fixed12");
}

}  // namespace hdf5_file_test
}  // namespace lifeline
