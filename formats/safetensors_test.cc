#include "formats/safetensors.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tests/kit/test_kit.h"

namespace lifeline::format {
namespace safetensors_test {

using ::testing::HasSubstr;

constexpr char kFile[] = "shard-7.safetensors";

// ---- helpers ----

std::string LengthField(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i, n >>= 8) out[i] = static_cast<char>(n & 0xff);
  return out;
}

Result<SafetensorsHeader> Parse(std::string_view json, uint64_t data_bytes = 1 << 20) {
  return ParseSafetensorsHeader(json, data_bytes, kFile);
}

// Asserts `s` failed with `code` and a message holding every one of `parts`.
template <typename T>
void ExpectError(const Result<T>& r, StatusCode code, std::initializer_list<std::string_view> parts) {
  ASSERT_FALSE(r.ok()) << "expected " << StatusCodeName(code);
  EXPECT_EQ(r.status().code(), code) << r.status().ToString();
  for (std::string_view p : parts) EXPECT_THAT(r.status().message(), HasSubstr(std::string(p)));
}

// A header with one entry whose fields are given as raw JSON.
std::string OneEntry(std::string_view name, std::string_view dtype, std::string_view shape, std::string_view offsets) {
  return "{\"" + std::string(name) + "\":{\"dtype\":" + std::string(dtype) + ",\"shape\":" + std::string(shape) +
         ",\"data_offsets\":" + std::string(offsets) + "}}";
}

// A header whose one entry "w" has the given raw JSON fields must be refused as Corruption naming
// the file, the entry and every one of `parts`.
void ExpectEntryRefused(std::string_view dtype, std::string_view shape, std::string_view offsets,
                        std::initializer_list<std::string_view> parts) {
  SCOPED_TRACE(std::string("dtype ") + std::string(dtype) + ", shape " + std::string(shape) + ", data_offsets " +
               std::string(offsets));
  Result<SafetensorsHeader> r = Parse(OneEntry("w", dtype, shape, offsets));
  ExpectError(r, StatusCode::kCorruption, {kFile, "'w'"});
  if (!r.ok()) {
    for (std::string_view p : parts) EXPECT_THAT(r.status().message(), HasSubstr(std::string(p)));
  }
}

using test::ReadWholeFile;
using test::TempDir;

// A whole file's bytes decoded as a reader decodes them: the length field, then the header. (Reading
// them from a file through the Env is lib's: lib/src/convert/safetensors_file_test.cc.)
Result<SafetensorsHeader> ParseFileBytes(std::string_view bytes, std::string_view file) {
  LL_ASSIGN_OR_RETURN(const uint64_t n,
                      DecodeSafetensorsHeaderLength(bytes.substr(0, kSafetensorsLengthBytes), bytes.size(), file));
  return ParseSafetensorsHeader(bytes.substr(kSafetensorsLengthBytes, n), bytes.size() - kSafetensorsLengthBytes - n,
                                file);
}

const std::vector<DType>& AllDTypes() {
  static const std::vector<DType> all = {DType::kF64, DType::kF32,  DType::kF16, DType::kBF16,
                                         DType::kF8E4M3, DType::kF8E5M2, DType::kI64, DType::kI32,
                                         DType::kI16, DType::kI8,   DType::kU8,  DType::kBool};
  return all;
}

// ---- dtypes ----

TEST(SafetensorsTest, DTypeNamesRoundTripAndArePublishedSpellings) {
  const std::vector<std::pair<DType, std::string>> expected = {
      {DType::kF64, "F64"},  {DType::kF32, "F32"}, {DType::kF16, "F16"}, {DType::kBF16, "BF16"},
      {DType::kF8E4M3, "F8_E4M3"}, {DType::kF8E5M2, "F8_E5M2"}, {DType::kI64, "I64"}, {DType::kI32, "I32"},
      {DType::kI16, "I16"},  {DType::kI8, "I8"},   {DType::kU8, "U8"},   {DType::kBool, "BOOL"}};
  for (const auto& [type, name] : expected) {
    EXPECT_EQ(SafetensorsDTypeName(type), name);
    EXPECT_EQ(ParseSafetensorsDType(name), type) << name;
  }
  EXPECT_EQ(ParseSafetensorsDType("f32"), std::nullopt);  // case-sensitive, as published
  EXPECT_EQ(ParseSafetensorsDType("float32"), std::nullopt);
  EXPECT_EQ(ParseSafetensorsDType("U16"), std::nullopt);
  EXPECT_EQ(SafetensorsDTypeName(static_cast<DType>(99)), "");
}

// ---- writing, and reading back ----

TEST(SafetensorsTest, PrefixRoundTripsEveryDTypeScalarAndEmptyTensor) {
  std::vector<SafetensorsEntry> entries;
  int i = 0;
  for (DType t : AllDTypes()) entries.push_back({"layer." + std::to_string(i++) + ".weight", t, {3, 5}});
  entries.push_back({"step", DType::kI64, {}});           // 0-d: one element
  entries.push_back({"empty", DType::kF32, {4, 0, 2}});   // no bytes
  entries.push_back({"bias", DType::kBF16, {7}});
  auto laid = LayOutSafetensors(entries);
  ASSERT_TRUE(laid.ok()) << laid.status().ToString();
  uint64_t expect_begin = 0;
  for (const auto& e : *laid) {
    EXPECT_EQ(e.begin, expect_begin) << e.name;
    expect_begin = e.end;
  }
  EXPECT_EQ((*laid)[12].end - (*laid)[12].begin, 8u);  // the 0-d I64
  EXPECT_EQ((*laid)[13].begin, (*laid)[13].end);        // the empty one
  const uint64_t data_bytes = laid->back().end;

  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"lifeline_step", "1200"}};
  auto prefix = BuildSafetensorsPrefix(*laid, metadata);
  ASSERT_TRUE(prefix.ok()) << prefix.status().ToString();
  EXPECT_EQ(prefix->size() % 8, 0u) << "data must start 8-byte aligned";

  auto n = DecodeSafetensorsHeaderLength(*prefix, prefix->size() + data_bytes, kFile);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n + 8, prefix->size());
  auto parsed = Parse(std::string_view(*prefix).substr(8), data_bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->tensors, *laid);  // same order: the layout is in data order
  EXPECT_EQ(parsed->metadata, metadata);
  EXPECT_EQ(parsed->data_offset, prefix->size());
  EXPECT_EQ(parsed->data_bytes, data_bytes);

  // As a whole file, with the data buffer behind the prefix.
  auto read = ParseFileBytes(*prefix + std::string(data_bytes, '\x5a'), kFile);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->tensors, *laid);
  EXPECT_EQ(read->metadata, metadata);
  EXPECT_EQ(read->data_offset, prefix->size());
  EXPECT_EQ(read->data_bytes, data_bytes);
}

TEST(SafetensorsTest, PrefixMatchesTheReferenceWritersBytes) {
  // The reference implementation's serializer tests give these exact headers.
  auto one = BuildSafetensorsPrefix({{"attn.0", DType::kF32, {1, 2, 3}, 0, 24}}, {});
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, LengthField(64) + R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})");
  auto padded = BuildSafetensorsPrefix({{"attn0", DType::kF32, {1, 1, 2, 3}, 0, 24}}, {});
  ASSERT_TRUE(padded.ok());
  EXPECT_EQ(*padded, LengthField(72) + R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})" +
                         std::string(7, ' '));
  auto empty = BuildSafetensorsPrefix({}, {});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, LengthField(8) + "{}      ");
  auto meta = BuildSafetensorsPrefix({}, {{"framework", "pt"}});
  ASSERT_TRUE(meta.ok());
  EXPECT_EQ(*meta, LengthField(40) + R"({"__metadata__":{"framework":"pt"}})" + std::string(5, ' '));
}

TEST(SafetensorsTest, NamesAndMetadataWithSpecialCharactersRoundTrip) {
  const std::string odd = "a\"b\\c\nd\te\x01f/g.h \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";
  auto laid = LayOutSafetensors({{odd, DType::kU8, {3}}, {"plain", DType::kI16, {2}}});
  ASSERT_TRUE(laid.ok());
  const std::map<std::string, std::string> metadata = {{odd, odd}, {"", ""}};
  auto prefix = BuildSafetensorsPrefix(*laid, metadata);
  ASSERT_TRUE(prefix.ok()) << prefix.status().ToString();
  auto parsed = Parse(std::string_view(*prefix).substr(8), 7);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_EQ(parsed->tensors.size(), 2u);
  EXPECT_EQ(parsed->tensors[0].name, odd);
  EXPECT_EQ(parsed->metadata, metadata);
}

TEST(SafetensorsTest, WriterRefusesWhatReadersWouldReject) {
  const std::map<std::string, std::string> none;
  ExpectError(BuildSafetensorsPrefix({{"a", DType::kF32, {2}, 0, 8}, {"b", DType::kF32, {2}, 16, 24}}, none),
              StatusCode::kInvalidArgument, {"'b'", "must begin at 8"});  // a hole
  ExpectError(BuildSafetensorsPrefix({{"a", DType::kF32, {2}, 8, 16}}, none), StatusCode::kInvalidArgument,
              {"'a'", "must begin at 0"});
  ExpectError(BuildSafetensorsPrefix({{"a", DType::kF32, {2}, 0, 4}}, none), StatusCode::kInvalidArgument,
              {"'a'", "dtype/size mismatch"});
  ExpectError(BuildSafetensorsPrefix({{"a", DType::kF32, {1}, 0, 4}, {"a", DType::kF32, {1}, 4, 8}}, none),
              StatusCode::kInvalidArgument, {"'a'", "twice"});
  ExpectError(BuildSafetensorsPrefix({{"__metadata__", DType::kU8, {1}, 0, 1}}, none), StatusCode::kInvalidArgument,
              {"__metadata__"});
  ExpectError(BuildSafetensorsPrefix({{"bad\xff", DType::kU8, {1}, 0, 1}}, none), StatusCode::kInvalidArgument,
              {"UTF-8"});
  ExpectError(BuildSafetensorsPrefix({{"", DType::kU8, {1}, 0, 1}}, none), StatusCode::kInvalidArgument,
              {"empty tensor name"});
  ExpectError(BuildSafetensorsPrefix({}, {{"k", "\xc0\xaf"}}), StatusCode::kInvalidArgument, {"'k'", "UTF-8"});
  ExpectError(BuildSafetensorsPrefix({{"x", static_cast<DType>(0), {1}, 0, 1}}, none), StatusCode::kInvalidArgument,
              {"'x'", "invalid dtype"});

  ExpectError(LayOutSafetensors({{"neg", DType::kF32, {2, -1}}}), StatusCode::kInvalidArgument, {"'neg'", "negative"});
  ExpectError(LayOutSafetensors({{"big", DType::kF64, {int64_t{1} << 62}}}), StatusCode::kInvalidArgument,
              {"'big'", "overflow"});
  ExpectError(LayOutSafetensors({{"deep", DType::kU8, std::vector<int64_t>(kMaxRank + 1, 1)}}),
              StatusCode::kInvalidArgument, {"'deep'", "dimensions"});
}

// ---- reading hostile headers ----

TEST(SafetensorsTest, AcceptsHolesSharedEmptyOffsetsAnyKeyOrderAndTrailingSpaces) {
  const std::string json =
      R"(  { "b": {"data_offsets": [32, 48], "shape": [4], "dtype": "F32"},
            "z": {"shape": [0], "dtype": "F64", "data_offsets": [32, 32]},
            "a": {"dtype": "I8", "shape": [8], "data_offsets": [0, 8]},
            "__metadata__": {"k": "v"} }      )";
  auto r = Parse(json, 64);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->tensors.size(), 3u);
  EXPECT_EQ(r->tensors[0].name, "a");
  EXPECT_EQ(r->tensors[1].name, "z");  // [32, 32) sorts before [32, 48)
  EXPECT_EQ(r->tensors[2].name, "b");
  EXPECT_EQ(r->metadata.at("k"), "v");
  EXPECT_EQ(r->data_offset, 8 + json.size());
}

TEST(SafetensorsTest, RejectsJsonThatIsNotAnObject) {
  ExpectError(Parse("{\"a\": {\"dtype\": \"F32\""), StatusCode::kCorruption, {kFile, "invalid JSON", "'a'"});
  ExpectError(Parse("not json at all"), StatusCode::kCorruption, {kFile, "invalid JSON"});
  ExpectError(Parse(""), StatusCode::kCorruption, {kFile, "invalid JSON"});
  ExpectError(Parse("[1, 2, 3]"), StatusCode::kCorruption, {kFile, "not a JSON object", "array"});
  ExpectError(Parse("\"F32\""), StatusCode::kCorruption, {kFile, "not a JSON object", "string"});
  ExpectError(Parse("42"), StatusCode::kCorruption, {kFile, "not a JSON object"});
  ExpectError(Parse("{} {}"), StatusCode::kCorruption, {kFile, "invalid JSON"});
  // A NUL byte ends the input for nlohmann's lexer: it must not hide trailing garbage.
  ExpectError(Parse(std::string("{}\0\0\0", 5)), StatusCode::kCorruption, {kFile, "invalid JSON", "NUL byte at byte 2"});
  ExpectError(Parse(std::string("{}") + '\0' + "{\"x\": 1}"), StatusCode::kCorruption, {kFile, "NUL"});
  ExpectError(Parse("{\"w\xff\": 1}"), StatusCode::kCorruption, {kFile, "invalid JSON"});  // not UTF-8
  ExpectError(Parse(R"({"w": [1]})"), StatusCode::kCorruption, {kFile, "'w'", "must be an object"});
  ExpectError(Parse(R"({"w": "F32"})"), StatusCode::kCorruption, {kFile, "'w'", "must be an object"});
}

TEST(SafetensorsTest, SurvivesDeepNesting) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  ExpectError(Parse(deep), StatusCode::kCorruption, {kFile, "not a JSON object"});
  const std::string deep_in_entry = "{\"w\": {\"shape\": " + std::string(100000, '[');
  ExpectError(Parse(deep_in_entry), StatusCode::kCorruption, {kFile, "'w'", "shape"});
}

TEST(SafetensorsTest, RejectsOffsetsOutsideTheDataBuffer) {
  ExpectError(Parse(OneEntry("w", "\"F32\"", "[4]", "[0, 16]"), 8), StatusCode::kCorruption,
              {kFile, "'w'", "[0, 16)", "past the end of the data buffer", "8 bytes"});
  ExpectError(Parse(OneEntry("w", "\"F32\"", "[0]", "[18446744073709551615, 18446744073709551615]"), 8),
              StatusCode::kCorruption, {kFile, "'w'", "past the end"});
}

TEST(SafetensorsTest, RejectsBeginAfterEnd) {
  ExpectError(Parse(OneEntry("w", "\"U8\"", "[4]", "[8, 4]"), 16), StatusCode::kCorruption,
              {kFile, "'w'", "[8, 4)", "begin after they end"});
}

TEST(SafetensorsTest, RejectsOverlappingTensors) {
  const std::string json = R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                               "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})";
  ExpectError(Parse(json, 64), StatusCode::kCorruption, {kFile, "'a' [0, 16)", "'b' [8, 24)", "overlap"});
  // Contained within a larger tensor, listed first.
  const std::string inside = R"({"small": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]},
                                 "big": {"dtype": "U8", "shape": [32], "data_offsets": [0, 32]},
                                 "after": {"dtype": "U8", "shape": [2], "data_offsets": [10, 12]}})";
  ExpectError(Parse(inside, 64), StatusCode::kCorruption, {kFile, "'big' [0, 32)", "'small' [4, 6)", "overlap"});
  // Exact duplicates of a non-empty range overlap too.
  const std::string same = R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                               "b": {"dtype": "I8", "shape": [2], "data_offsets": [0, 2]}})";
  ExpectError(Parse(same, 64), StatusCode::kCorruption, {kFile, "'a'", "'b'", "overlap"});
}

TEST(SafetensorsTest, RejectsDTypeSizeMismatch) {
  ExpectError(Parse(OneEntry("w", "\"F32\"", "[2, 3]", "[0, 20]"), 64), StatusCode::kCorruption,
              {kFile, "'w'", "dtype/size mismatch", "[2, 3]", "F32", "needs 24 bytes", "[0, 20)", "hold 20"});
  ExpectError(Parse(OneEntry("s", "\"I64\"", "[]", "[0, 0]"), 64), StatusCode::kCorruption,
              {kFile, "'s'", "dtype/size mismatch", "needs 8 bytes"});  // a 0-d tensor has one element
}

TEST(SafetensorsTest, RejectsShapesWhoseSizeOverflows) {
  // 2^32 * 2^32 elements: more than 2^63 - 1.
  ExpectEntryRefused("\"U8\"", "[4294967296, 4294967296]", "[0, 0]", {"more than 2^63-1 elements"});
  // 2^61 elements of 8 bytes: 2^64 bytes.
  ExpectEntryRefused("\"F64\"", "[2305843009213693952]", "[0, 0]", {"more than 2^64-1 bytes"});
  // Overflow before a zero extent is still an overflow (as in the reference reader).
  ExpectEntryRefused("\"U8\"", "[4294967296, 4294967296, 0]", "[0, 0]", {"more than 2^63-1 elements"});
  ExpectEntryRefused("\"U8\"", "[9223372036854775808]", "[0, 0]", {"exceeds 2^63-1"});
  ExpectEntryRefused("\"U8\"", "[99999999999999999999999]", "[0, 0]", {"not an integer"});
  // A zero extent first keeps the product at 0: an empty tensor, fine.
  EXPECT_TRUE(Parse(OneEntry("w", "\"U8\"", "[0, 4294967296, 4294967296]", "[0, 0]")).ok());
}

TEST(SafetensorsTest, RejectsBadShapeValues) {
  ExpectEntryRefused("\"F32\"", "[-1, 4]", "[0, 0]", {"negative value -1"});
  ExpectEntryRefused("\"F32\"", "[2.5]", "[0, 10]", {"2.5", "not an integer"});
  ExpectEntryRefused("\"F32\"", "[2.0]", "[0, 8]", {"not an integer"});
  ExpectEntryRefused("\"F32\"", "[\"2\"]", "[0, 8]", {"shape must hold non-negative integers, not a string"});
  ExpectEntryRefused("\"F32\"", "[null]", "[0, 4]", {"null"});
  ExpectEntryRefused("\"F32\"", "[[2]]", "[0, 8]", {"array"});
  ExpectEntryRefused("\"F32\"", "4", "[0, 16]", {"shape must be an array"});
  ExpectEntryRefused("\"F32\"", "[1]", "[0, -4]", {"data_offsets", "negative"});
  ExpectEntryRefused("\"F32\"", "[1]", "[0]", {"data_offsets has 1 values, not 2"});
  ExpectEntryRefused("\"F32\"", "[1]", "[0, 4, 8]", {"more than 2 values"});
}

TEST(SafetensorsTest, RejectsTooManyDimensions) {
  std::string ones = "[1";
  for (uint32_t i = 1; i < kMaxRank; ++i) ones += ",1";
  EXPECT_TRUE(Parse(OneEntry("w", "\"U8\"", ones + "]", "[0, 1]")).ok());
  ExpectError(Parse(OneEntry("w", "\"U8\"", ones + ",1]", "[0, 1]")), StatusCode::kCorruption,
              {kFile, "'w'", "more than 32 dimensions"});
}

TEST(SafetensorsTest, RejectsUnknownAndUnsupportedDTypes) {
  ExpectEntryRefused("\"F31\"", "[1]", "[0, 4]", {"unknown dtype 'F31'"});
  ExpectEntryRefused("\"f32\"", "[1]", "[0, 4]", {"unknown dtype 'f32'"});
  ExpectEntryRefused("7", "[1]", "[0, 4]", {"dtype must be a string"});
  for (const char* published : {"U16", "U32", "U64", "C64", "F4", "F6_E2M3", "F6_E3M2", "F8_E8M0", "F8_E4M3FNUZ",
                                "F8_E5M2FNUZ"}) {
    SCOPED_TRACE(published);
    ExpectError(Parse(OneEntry("model.w", "\"" + std::string(published) + "\"", "[1]", "[0, 4]")),
                StatusCode::kNotSupported, {kFile, "'model.w'", "'" + std::string(published) + "'"});
  }
}

TEST(SafetensorsTest, RejectsDuplicateKeys) {
  const std::string dup = R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                              "w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})";
  ExpectError(Parse(dup, 8), StatusCode::kCorruption, {kFile, "'w'", "appears twice"});
  // Compared after unescaping: "\u0077" is "w".
  const std::string escaped = R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                                  "\u0077": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})";
  ExpectError(Parse(escaped, 8), StatusCode::kCorruption, {kFile, "'w'", "appears twice"});
  ExpectError(Parse(R"({"__metadata__": {}, "__metadata__": {}})"), StatusCode::kCorruption,
              {kFile, "duplicate key '__metadata__'"});
  ExpectError(Parse(R"({"__metadata__": {"a": "1", "a": "2"}})"), StatusCode::kCorruption,
              {kFile, "__metadata__", "duplicate key 'a'"});
  ExpectError(Parse(R"({"w": {"dtype": "U8", "dtype": "I8", "shape": [1], "data_offsets": [0, 1]}})"),
              StatusCode::kCorruption, {kFile, "'w'", "duplicate key 'dtype'"});
}

TEST(SafetensorsTest, RejectsBadMetadata) {
  ExpectError(Parse(R"({"__metadata__": {"epoch": 3}})"), StatusCode::kCorruption,
              {kFile, "__metadata__", "'epoch'", "must be a string, not a number"});
  ExpectError(Parse(R"({"__metadata__": {"cfg": {"a": "b"}}})"), StatusCode::kCorruption,
              {kFile, "'cfg'", "must be a string"});
  ExpectError(Parse(R"({"__metadata__": ["a"]})"), StatusCode::kCorruption,
              {kFile, "__metadata__ must be an object"});
  ExpectError(Parse(R"({"__metadata__": null})"), StatusCode::kCorruption, {kFile, "__metadata__ must be an object"});
}

TEST(SafetensorsTest, RejectsExtraAndMissingKeys) {
  ExpectError(Parse(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "offsets": [0, 1]}})"),
              StatusCode::kCorruption, {kFile, "'w'", "unexpected key 'offsets'"});
  ExpectError(Parse(R"({"w": {"dtype": "U8", "data_offsets": [0, 1]}})"), StatusCode::kCorruption,
              {kFile, "'w'", "missing key 'shape'"});
  ExpectError(Parse(R"({"w": {}})"), StatusCode::kCorruption, {kFile, "'w'", "missing key 'dtype'"});
}

TEST(SafetensorsTest, RejectsNamesLifelineCannotHold) {
  ExpectError(Parse(OneEntry("", "\"U8\"", "[1]", "[0, 1]")), StatusCode::kNotSupported, {kFile, "empty tensor name"});
  const std::string long_name(kMaxNameBytes + 1, 'n');
  ExpectError(Parse(OneEntry(long_name, "\"U8\"", "[1]", "[0, 1]")), StatusCode::kNotSupported,
              {kFile, "4097 bytes exceeds 4096"});
  ExpectError(Parse(OneEntry("a\\u0000b", "\"U8\"", "[1]", "[0, 1]")), StatusCode::kNotSupported,
              {kFile, "NUL"});
  EXPECT_TRUE(Parse(OneEntry(std::string(kMaxNameBytes, 'n'), "\"U8\"", "[1]", "[0, 1]")).ok());
}

TEST(SafetensorsTest, MutatedHeadersParseConsistentlyOrFail) {
  // Random byte edits of a valid header: each either fails with Corruption/NotSupported or
  // yields tensors that keep every promise ParseSafetensorsHeader makes.
  auto laid = LayOutSafetensors({{"a", DType::kF32, {2, 3}}, {"bb", DType::kI8, {}}, {"c", DType::kBF16, {0, 4}},
                                 {"d", DType::kF64, {1, 2, 1}}});
  ASSERT_TRUE(laid.ok());
  auto prefix = BuildSafetensorsPrefix(*laid, {{"k", "v"}});
  ASSERT_TRUE(prefix.ok());
  const std::string base = prefix->substr(8);
  std::string alphabet = "{}[],:\"0123456789-.eE ae\\u\xff";
  alphabet.push_back('\0');
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  int parsed_ok = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string m = base;
    const int edits = 1 + static_cast<int>(next() % 3);
    for (int k = 0; k < edits; ++k) {
      const size_t pos = next() % m.size();
      const char c = alphabet[next() % alphabet.size()];
      switch (next() % 3) {
        case 0: m[pos] = c; break;
        case 1: m.insert(m.begin() + static_cast<std::ptrdiff_t>(pos), c); break;
        default: m.erase(pos, 1 + next() % 4); break;
      }
      if (m.empty()) m = "{";
    }
    const uint64_t data_bytes = next() % 96;
    auto r = Parse(m, data_bytes);
    if (!r.ok()) {
      EXPECT_TRUE(r.status().IsCorruption() || r.status().IsNotSupported()) << r.status().ToString();
      EXPECT_THAT(r.status().message(), HasSubstr(kFile));
      continue;
    }
    ++parsed_ok;
    uint64_t prev_begin = 0, reach = 0;
    for (const SafetensorsEntry& e : r->tensors) {
      uint64_t bytes = DTypeSize(e.dtype);
      for (int64_t d : e.shape) {
        ASSERT_GE(d, 0);
        bytes *= static_cast<uint64_t>(d);
      }
      EXPECT_LE(e.shape.size(), kMaxRank);
      EXPECT_LE(e.begin, e.end);
      EXPECT_LE(e.end, data_bytes);
      EXPECT_EQ(e.end - e.begin, bytes) << e.name;
      EXPECT_GE(e.begin, prev_begin);
      if (e.begin != e.end) {
        EXPECT_GE(e.begin, reach) << "overlap at " << e.name;
        reach = e.end;
      }
      prev_begin = e.begin;
    }
  }
  EXPECT_GT(parsed_ok, 0);  // some mutations (spaces, renamed keys) stay valid
}

// ---- reading files ----


TEST(SafetensorsTest, HeaderLengthBeyondTheReferenceLimitIsRefused) {
  ExpectError(DecodeSafetensorsHeaderLength(LengthField(kMaxSafetensorsHeaderBytes + 1), uint64_t{1} << 40, kFile),
              StatusCode::kCorruption, {kFile, "exceeds the limit"});
  ExpectError(DecodeSafetensorsHeaderLength(LengthField(~uint64_t{0}), ~uint64_t{0}, kFile), StatusCode::kCorruption,
              {kFile, "exceeds the limit"});
  auto at_limit = DecodeSafetensorsHeaderLength(LengthField(kMaxSafetensorsHeaderBytes), uint64_t{1} << 40, kFile);
  ASSERT_TRUE(at_limit.ok());
  EXPECT_EQ(*at_limit, kMaxSafetensorsHeaderBytes);
}

// ---- sharding ----

TEST(SafetensorsTest, ShardPlanningIsGreedyInOrder) {
  using Plan = std::vector<std::vector<size_t>>;
  // Exactly filling a shard keeps the tensor; one byte more starts the next.
  EXPECT_EQ(PlanSafetensorsShards({4, 6, 10, 1}, 10), (Plan{{0, 1}, {2}, {3}}));
  EXPECT_EQ(PlanSafetensorsShards({4, 7, 3}, 10), (Plan{{0}, {1, 2}}));
  // Larger than the limit: a shard of its own, wherever it falls.
  EXPECT_EQ(PlanSafetensorsShards({3, 25, 3, 3}, 10), (Plan{{0}, {1}, {2, 3}}));
  EXPECT_EQ(PlanSafetensorsShards({25, 30}, 10), (Plan{{0}, {1}}));
  // Zero-byte tensors ride along.
  EXPECT_EQ(PlanSafetensorsShards({10, 0, 0, 1}, 10), (Plan{{0, 1, 2}, {3}}));
  // No limit, no tensors.
  EXPECT_EQ(PlanSafetensorsShards({1, 2, uint64_t{1} << 62, 5}, 0), (Plan{{0, 1, 2, 3}}));
  EXPECT_EQ(PlanSafetensorsShards({}, 10), (Plan{{}}));
  EXPECT_EQ(PlanSafetensorsShards({}, 0), (Plan{{}}));
  // Sums near 2^64 do not wrap around into a shard.
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(PlanSafetensorsShards({max - 1, 5, 5}, max), (Plan{{0}, {1, 2}}));
  EXPECT_EQ(PlanSafetensorsShards({max, max, 1}, 0), (Plan{{0, 1, 2}}));
}

TEST(SafetensorsTest, ShardNamesFollowTransformers) {
  EXPECT_EQ(SafetensorsShardName(0, 1), "model.safetensors");
  EXPECT_EQ(SafetensorsShardName(0, 3), "model-00001-of-00003.safetensors");
  EXPECT_EQ(SafetensorsShardName(2, 3), "model-00003-of-00003.safetensors");
  EXPECT_EQ(SafetensorsShardName(41, 120), "model-00042-of-00120.safetensors");
  EXPECT_EQ(SafetensorsShardName(99999, 100000), "model-100000-of-100000.safetensors");
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(IsSafeSafetensorsFileName(SafetensorsShardName(i, 3)));
}

// ---- index ----

TEST(SafetensorsTest, IndexRoundTrips) {
  const std::vector<std::pair<std::string, std::string>> weight_map = {
      {"embed.weight", "model-00001-of-00002.safetensors"},
      {"layers.0.attn.q", "model-00001-of-00002.safetensors"},
      {"lm_head.weight", "model-00002-of-00002.safetensors"},
      {"layers.0.attn.\"k\"", "model-00001-of-00002.safetensors"}};
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  auto json = BuildSafetensorsIndex(123456789012, weight_map, metadata);
  ASSERT_TRUE(json.ok()) << json.status().ToString();
  EXPECT_THAT(*json, HasSubstr("\"total_size\": 123456789012"));  // a number, as transformers writes it
  auto index = ParseSafetensorsIndex(*json, kSafetensorsIndexFileName);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(index->total_size, 123456789012u);
  EXPECT_EQ(index->weight_map, weight_map);
  EXPECT_EQ(index->metadata, metadata);
  EXPECT_EQ(index->files, (std::vector<std::string>{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}));

  auto empty = BuildSafetensorsIndex(0, {}, {});
  ASSERT_TRUE(empty.ok());
  auto parsed_empty = ParseSafetensorsIndex(*empty, kSafetensorsIndexFileName);
  ASSERT_TRUE(parsed_empty.ok()) << parsed_empty.status().ToString() << "\n" << *empty;
  EXPECT_TRUE(parsed_empty->weight_map.empty());
}

TEST(SafetensorsTest, IndexParsesWhatTransformersWrites) {
  const std::string json = R"({
  "metadata": {
    "total_parameters": 8030261248,
    "total_size": 16060522496
  },
  "weight_map": {
    "lm_head.weight": "model-00004-of-00004.safetensors",
    "model.embed_tokens.weight": "model-00001-of-00004.safetensors"
  },
  "future_key": {"nested": [1, {"deeper": [true, null]}]}
})";
  auto index = ParseSafetensorsIndex(json, kSafetensorsIndexFileName);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(index->total_size, 16060522496u);
  EXPECT_TRUE(index->metadata.empty());
  ASSERT_EQ(index->weight_map.size(), 2u);
  EXPECT_EQ(index->weight_map[1].first, "model.embed_tokens.weight");
  EXPECT_EQ(index->files, (std::vector<std::string>{"model-00004-of-00004.safetensors", "model-00001-of-00004.safetensors"}));
  // No metadata at all: total_size stays 0.
  auto bare = ParseSafetensorsIndex(R"({"weight_map": {"w": "a.safetensors"}})", kSafetensorsIndexFileName);
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->total_size, 0u);
}

TEST(SafetensorsTest, IndexRejectsFileNamesThatEscapeTheDirectory) {
  const std::string long_name(kMaxFileNameBytes + 1, 'f');
  for (const std::string& bad : {std::string("../x.safetensors"), std::string("/etc/passwd"),
                                 std::string("a/b.safetensors"), std::string(".."), std::string("."), std::string(""),
                                 std::string("a\\\\b.safetensors"), std::string("a\\u0000b"), long_name}) {
    SCOPED_TRACE(bad);
    const std::string json = R"({"weight_map": {"ok": "model.safetensors", "layers.3.w": ")" + bad + "\"}}";
    ExpectError(ParseSafetensorsIndex(json, kSafetensorsIndexFileName), StatusCode::kCorruption,
                {kSafetensorsIndexFileName, "'layers.3.w'", "unsafe file name"});
  }
  EXPECT_TRUE(IsSafeSafetensorsFileName(std::string(kMaxFileNameBytes, 'f')));
  EXPECT_TRUE(IsSafeSafetensorsFileName("..model.safetensors"));  // only "." and ".." are special
  for (const std::string& bad : {std::string("../x.safetensors"), std::string("/etc/passwd"), std::string("a/b"),
                                 std::string(".."), std::string("")}) {
    ExpectError(BuildSafetensorsIndex(1, {{"w", bad}}, {}), StatusCode::kInvalidArgument, {"'w'", "unsafe file name"});
  }
}

TEST(SafetensorsTest, IndexRejectsMalformedContent) {
  const std::string_view f = kSafetensorsIndexFileName;
  ExpectError(ParseSafetensorsIndex(R"({"metadata": {"total_size": 1}})", f), StatusCode::kCorruption,
              {f, "no \"weight_map\""});
  ExpectError(ParseSafetensorsIndex(R"({"weight_map": {"w": 3}})", f), StatusCode::kCorruption,
              {f, "'w'", "must map to a file name string, not a number"});
  ExpectError(ParseSafetensorsIndex(R"({"weight_map": {"w": ["a.safetensors"]}})", f), StatusCode::kCorruption,
              {f, "'w'", "not an array"});
  ExpectError(ParseSafetensorsIndex(R"({"weight_map": {"w": "a.safetensors", "w": "b.safetensors"}})", f),
              StatusCode::kCorruption, {f, "'w'", "appears twice"});
  ExpectError(ParseSafetensorsIndex(R"({"weight_map": {}, "weight_map": {}})", f), StatusCode::kCorruption,
              {f, "duplicate key 'weight_map'"});
  ExpectError(ParseSafetensorsIndex(R"({"weight_map": ["w"]})", f), StatusCode::kCorruption,
              {f, "weight_map must be an object"});
  ExpectError(ParseSafetensorsIndex(R"({"metadata": [], "weight_map": {}})", f), StatusCode::kCorruption,
              {f, "metadata must be an object"});
  ExpectError(ParseSafetensorsIndex(R"({"metadata": {"total_size": -5}, "weight_map": {}})", f),
              StatusCode::kCorruption, {f, "total_size -5 is negative"});
  ExpectError(ParseSafetensorsIndex(R"({"metadata": {"total_size": "12"}, "weight_map": {}})", f),
              StatusCode::kCorruption, {f, "total_size must be a non-negative integer"});
  ExpectError(ParseSafetensorsIndex(R"({"metadata": {"total_size": 1.5}, "weight_map": {}})", f),
              StatusCode::kCorruption, {f, "total_size 1.5"});
  ExpectError(ParseSafetensorsIndex("[]", f), StatusCode::kCorruption, {f, "not a JSON object"});
  ExpectError(ParseSafetensorsIndex("{\"weight_map\": {\"w\": \"a\"", f), StatusCode::kCorruption,
              {f, "invalid JSON", "'w'"});
  ExpectError(ParseSafetensorsIndex(R"({"weight_map": {"": "a.safetensors"}})", f), StatusCode::kNotSupported,
              {f, "empty tensor name"});
  const std::string deep = R"({"x": )" + std::string(1000, '[') + std::string(1000, ']') + R"(, "weight_map": {}})";
  ExpectError(ParseSafetensorsIndex(deep, f), StatusCode::kCorruption, {f, "nested deeper"});

  ExpectError(BuildSafetensorsIndex(1, {{"w", "a.safetensors"}, {"w", "b.safetensors"}}, {}),
              StatusCode::kInvalidArgument, {"'w'", "twice"});
  ExpectError(BuildSafetensorsIndex(1, {}, {{"total_size", "2"}}), StatusCode::kInvalidArgument, {"total_size"});
}

// ---- cross-checks with an independent implementation (Python's standard library) ----

constexpr char kPython[] = "/usr/bin/python3";

// Runs a Python script with `args`; returns its exit status and stdout.
std::pair<int, std::string> RunPython(const TempDir& dir, const std::string& script, const std::string& args) {
  const std::string script_path = dir.Write("script.py", script);
  const std::string cmd = std::string(kPython) + " '" + script_path + "' " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = ::pclose(p);
  return {rc, out};
}

TEST(SafetensorsTest, ReadsAFileWrittenByAnIndependentWriter) {
  if (::access(kPython, X_OK) != 0) GTEST_SKIP() << kPython << " not available";
  TempDir dir;
  // Written from the published layout only: no padding, entries in reverse data order, the
  // metadata last, keys of each entry in another order, json.dumps' default separators.
  const std::string script = R"PY(
import json, struct, sys
tensors = [
    ("embed", "F32", [2, 3], struct.pack("<6f", 0.5, 1.5, 2.5, -3.0, 4.25, 1e-3)),
    ("scale", "F64", [], struct.pack("<d", 3.141592653589793)),
    ("mask", "BOOL", [4], bytes([1, 0, 0, 1])),
    ("none", "I32", [0, 7], b""),
    ("ids", "I64", [3], struct.pack("<3q", -1, 2**40, 7)),
    ("half", "BF16", [2], struct.pack("<2H", 0x3f80, 0xc000)),
]
header, data = {}, b""
for name, dtype, shape, raw in tensors:
    header[name] = {"data_offsets": [len(data), len(data) + len(raw)], "shape": shape, "dtype": dtype}
    data += raw
ordered = dict(reversed(list(header.items())))
ordered["__metadata__"] = {"format": "pt", "note": "caf\u00e9 \"quoted\""}
text = json.dumps(ordered).encode("utf-8")
assert len(text) % 8 != 0, "want an unaligned data start"
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + data)
print(len(text), len(data))
)PY";
  const std::string path = dir.path() + "/independent.safetensors";
  auto [rc, out] = RunPython(dir, script, "'" + path + "'");
  ASSERT_EQ(rc, 0) << out;
  uint64_t n = 0, data_len = 0;
  ASSERT_EQ(std::sscanf(out.c_str(), "%lu %lu", &n, &data_len), 2) << out;

  const std::string file = ReadWholeFile(path);
  auto h = ParseFileBytes(file, path);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->data_offset, 8 + n);
  EXPECT_EQ(h->data_bytes, data_len);
  EXPECT_EQ(h->metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"note", "caf\xc3\xa9 \"quoted\""}}));
  const std::vector<SafetensorsEntry> expected = {
      {"embed", DType::kF32, {2, 3}, 0, 24},  {"scale", DType::kF64, {}, 24, 32}, {"mask", DType::kBool, {4}, 32, 36},
      {"none", DType::kI32, {0, 7}, 36, 36}, {"ids", DType::kI64, {3}, 36, 60},  {"half", DType::kBF16, {2}, 60, 64}};
  EXPECT_EQ(h->tensors, expected);

  // The offsets are relative to the data buffer: the bytes they point at are the tensors' values.
  float embed[6];
  std::memcpy(embed, file.data() + h->data_offset + h->tensors[0].begin, sizeof(embed));
  EXPECT_EQ(embed[0], 0.5f);
  EXPECT_EQ(embed[4], 4.25f);
  double scale;
  std::memcpy(&scale, file.data() + h->data_offset + h->tensors[1].begin, sizeof(scale));
  EXPECT_EQ(scale, 3.141592653589793);
  int64_t ids[3];
  std::memcpy(ids, file.data() + h->data_offset + h->tensors[4].begin, sizeof(ids));
  EXPECT_EQ(ids[1], int64_t{1} << 40);
}

TEST(SafetensorsTest, AnIndependentReaderAcceptsOurFilesAndIndex) {
  if (::access(kPython, X_OK) != 0) GTEST_SKIP() << kPython << " not available";
  TempDir dir;
  auto laid = LayOutSafetensors({{"w.\xc3\xa9", DType::kF16, {3, 3}}, {"b", DType::kF32, {3}}, {"s", DType::kI8, {}}});
  ASSERT_TRUE(laid.ok());
  auto prefix = BuildSafetensorsPrefix(*laid, {{"format", "pt"}});
  ASSERT_TRUE(prefix.ok());
  std::string data;
  for (uint64_t i = 0; i < laid->back().end; ++i) data.push_back(static_cast<char>(i));
  const std::string path = dir.Write("model.safetensors", *prefix + data);
  auto index = BuildSafetensorsIndex(data.size(), {{"w.\xc3\xa9", "model.safetensors"}, {"b", "model.safetensors"},
                                                   {"s", "model.safetensors"}}, {});
  ASSERT_TRUE(index.ok());
  const std::string index_path = dir.Write(std::string(kSafetensorsIndexFileName), *index);

  // The reference reader's rules: offsets sorted, gap-free, ending exactly at the end of the file.
  const std::string script = R"PY(
import json, struct, sys
SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
         "F8_E4M3": 1, "F8_E5M2": 1}
b = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", b[:8])
assert (8 + n) % 8 == 0
header = json.loads(b[8:8 + n].decode("utf-8"))
assert list(header)[0] == "__metadata__", list(header)
assert header.pop("__metadata__") == {"format": "pt"}
start = 0
for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
    assert sorted(info) == ["data_offsets", "dtype", "shape"], info
    s, e = info["data_offsets"]
    count = 1
    for d in info["shape"]:
        count *= d
    assert s == start and e - s == count * SIZES[info["dtype"]], (name, info)
    start = e
assert 8 + n + start == len(b), "data buffer must end at the end of the file"
index = json.load(open(sys.argv[2]))
assert index["metadata"]["total_size"] == start
assert set(index["weight_map"]) == set(header), (index, list(header))
print("ok", sorted(header))
)PY";
  auto [rc, out] = RunPython(dir, script, "'" + path + "' '" + index_path + "'");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_THAT(out, HasSubstr("ok ['b', 's', 'w.\xc3\xa9']"));
}

}  // namespace safetensors_test
}  // namespace lifeline::format
