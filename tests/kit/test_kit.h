// The test kit shared by every C++ test (formats, lib, tests/integration, tests/agent): a temporary
// directory removed with its contents, whole-file reads and writes, and deterministic byte
// patterns. It uses POSIX directly rather than the Env, so a test of the Env (or of formats, below
// it) can use it without depending on what it checks.
//
// Memory aligned for direct I/O is lifeline::AlignedBuffer (lib/src/aligned_buffer.h), the
// library's own; tests use it rather than a copy.
#ifndef LIFELINE_TESTS_KIT_TEST_KIT_H_
#define LIFELINE_TESTS_KIT_TEST_KIT_H_

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace lifeline::test {

// Removes `path` and, for a directory, everything below it; symbolic links are removed, never
// followed. Missing paths are ignored.
inline void RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    if (DIR* d = ::opendir(path.c_str())) {
      std::vector<std::string> names;
      while (dirent* e = ::readdir(d)) {
        const std::string n = e->d_name;
        if (n != "." && n != "..") names.push_back(n);
      }
      ::closedir(d);
      for (const std::string& n : names) RemoveTree(path + "/" + n);
    }
    ::rmdir(path.c_str());
  } else {
    ::unlink(path.c_str());
  }
}

inline std::string ReadWholeFile(const std::string& path) {
  std::string bytes;
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    char buf[65536];
    size_t got;
    while ((got = std::fread(buf, 1, sizeof(buf), f)) > 0) bytes.append(buf, got);
    std::fclose(f);
  }
  return bytes;
}

// Creates or truncates `path` to hold `bytes`; false when any step fails.
inline bool WriteWholeFile(const std::string& path, const std::string& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  return std::fclose(f) == 0 && ok;
}

// The names in `dir` ("." and ".." left out), in directory order; empty when it cannot be read.
inline std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
  }
  return names;
}

// A fresh directory under `base` (/tmp unless given: /dev/shm for tmpfs), removed with everything
// in it when destroyed. path() is empty when it could not be created. Not copyable.
class TempDir {
 public:
  explicit TempDir(const std::string& base = "/tmp", const std::string& prefix = "lifeline-test") {
    std::string tmpl = base + "/" + prefix + "-XXXXXX";
    if (const char* p = ::mkdtemp(tmpl.data())) path_ = p;
  }
  ~TempDir() {
    if (!path_.empty()) RemoveTree(path_);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // The path of `name` inside the directory.
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }
  // Writes `bytes` to `name` inside the directory and returns its path; a failed write fails the
  // running test.
  std::string Write(const std::string& name, const std::string& bytes) const {
    const std::string p = Sub(name);
    EXPECT_TRUE(WriteWholeFile(p, bytes)) << "cannot write " << p;
    return p;
  }

 private:
  std::string path_;
};

// Deterministic bytes that differ with the position and the seed, so a byte landing in the wrong
// place, or coming from another buffer, is noticed.
inline void FillPattern(void* dst, size_t n, unsigned seed) {
  char* p = static_cast<char*>(dst);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<char>((i * 131 + seed * 7919) >> 3);
}

inline std::string PatternBytes(size_t n, unsigned seed) {
  std::string out(n, '\0');
  FillPattern(out.data(), n, seed);
  return out;
}

}  // namespace lifeline::test

#endif  // LIFELINE_TESTS_KIT_TEST_KIT_H_
