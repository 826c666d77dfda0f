// ReadSafetensorsHeader: a file's header read through the Env, in memory and on disk. What the
// header may say is formats/safetensors_test.cc's; these tests are about reading it.
#include "lib/src/convert/safetensors_file.h"

#include <initializer_list>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "lifeline/env.h"
#include "tests/kit/test_kit.h"

// In the test kit's namespace (tests/kit/test_kit.h): its helpers need no prefix.
namespace lifeline::test {
namespace safetensors_file_test {

using format::kMaxSafetensorsHeaderBytes;

// The 8-byte length field that starts a safetensors file.
std::string LengthField(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i, n >>= 8) out[i] = static_cast<char>(n & 0xff);
  return out;
}

// `r` failed with `code`, its status naming every one of `parts`.
void ExpectFailure(const Result<format::SafetensorsHeader>& r, StatusCode code,
                   std::initializer_list<std::string> parts) {
  ASSERT_FALSE(r.ok()) << "expected " << StatusCodeName(code);
  EXPECT_EQ(r.status().code(), code) << r.status().ToString();
  for (const std::string& p : parts) EXPECT_TRUE(StatusMentions(r.status(), p)) << r.status().ToString() << ": " << p;
}

// Opens `path` through the POSIX Env, following a link as for a file the user names, and reads its
// header: what the sources do (which also refuse what is not a regular file before opening it;
// that is tested in tensor_source_test.cc).
Result<format::SafetensorsHeader> ReadHeaderOf(const std::string& path) {
  FileOptions options;
  options.follow_symlinks = true;
  LL_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, Env::Default()->NewRandomAccessFile(path, options));
  return ReadSafetensorsHeader(*file);
}

// The reader does no I/O of its own: it reads whatever file the Env gives it, here one in memory.
TEST(SafetensorsFileTest, ReadsTheHeaderThroughTheEnvsFile) {
  std::unique_ptr<MemEnv> mem = NewMemEnv();
  const std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string bytes(8, '\0');
  bytes[0] = static_cast<char>(header.size());
  ASSERT_TRUE(WriteFileAtomically(mem.get(), "/m.safetensors", bytes + header + "12345678").ok());
  auto open = [&](const std::string& path) { return mem->NewRandomAccessFile(path, FileOptions{}).value(); };
  auto read = ReadSafetensorsHeader(*open("/m.safetensors"));
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ASSERT_EQ(read->tensors.size(), 1u);
  EXPECT_EQ(read->tensors[0].name, "w");
  EXPECT_EQ(read->data_bytes, 8u);
  // Cut inside the header: the length field promises more than the file holds, naming the file.
  ASSERT_TRUE(WriteFileAtomically(mem.get(), "/cut.safetensors", bytes + header.substr(0, 10)).ok());
  ExpectFailure(ReadSafetensorsHeader(*open("/cut.safetensors")), StatusCode::kCorruption,
                {"/cut.safetensors", "runs past the end"});
}

TEST(SafetensorsFileTest, ReadFileRejectsShortAndLyingFiles) {
  TempDir dir;
  const std::string valid_header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

  const std::string empty = dir.Write("empty.safetensors", "");
  ExpectFailure(ReadHeaderOf(empty), StatusCode::kCorruption, {empty, "too short"});
  const std::string five = dir.Write("five.safetensors", std::string("\x10\0\0\0\0", 5));
  ExpectFailure(ReadHeaderOf(five), StatusCode::kCorruption, {five, "5 bytes", "too short"});

  // The header length points past the end of the file.
  const std::string past = dir.Write("past.safetensors", LengthField(1000) + valid_header);
  ExpectFailure(ReadHeaderOf(past), StatusCode::kCorruption,
                {past, "header length 1000 runs past the end of the file", "1008",
                 std::to_string(8 + valid_header.size())});
  // Beyond the reference implementation's limit, in a file long enough to hold it (the limit
  // itself: formats/safetensors_test.cc, HeaderLengthBeyondTheReferenceLimitIsRefused).
  const std::string huge = dir.Write("huge.safetensors", LengthField(kMaxSafetensorsHeaderBytes + 1) + "{}");
  ExpectFailure(ReadHeaderOf(huge), StatusCode::kCorruption, {huge, "100000001", "exceeds the limit"});

  // Truncated in the data buffer: the header is intact, a tensor's bytes are not all there.
  const std::string cut = dir.Write("cut.safetensors", LengthField(valid_header.size()) + valid_header + "1234");
  ExpectFailure(ReadHeaderOf(cut), StatusCode::kCorruption,
                {cut, "'w'", "[0, 8)", "past the end of the data buffer (4 bytes)"});
  // The same file, complete.
  const std::string whole = dir.Write("whole.safetensors", LengthField(valid_header.size()) + valid_header + "12345678");
  auto ok = ReadHeaderOf(whole);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->data_offset, 8 + valid_header.size());  // no alignment required of other writers
  EXPECT_EQ(ok->data_bytes, 8u);

  // Header bytes that are not JSON, and errors from the header name the path.
  const std::string garbage = dir.Write("garbage.safetensors", LengthField(4) + "\x89PNG....");
  ExpectFailure(ReadHeaderOf(garbage), StatusCode::kCorruption, {garbage, "invalid JSON"});

  ExpectFailure(ReadHeaderOf(dir.path() + "/missing.safetensors"), StatusCode::kNotFound, {"missing.safetensors"});
  // A directory is refused as "not a regular file" by the opener, OpenUserFile
  // (tensor_source_test.cc, TensorSourcePosixTest.WhatIsNotARegularFileIsRefused).
}

}  // namespace safetensors_file_test
}  // namespace lifeline::test
