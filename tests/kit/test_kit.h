// The test kit shared by every C++ test (formats, lib, tests/integration, tests/agent): a temporary
// directory removed with its contents, whole-file reads and writes, and deterministic byte
// patterns. It uses POSIX directly rather than the Env, so a test of the Env (or of formats, below
// it) can use it without depending on what it checks.
//
// For the library's own tests it also has checkpoint options scaled down to a test's size and a
// status check. Those only fill in structs (and call RunHash); a test that uses none of them links
// nothing of the library for them.
//
// Memory aligned for direct I/O is lifeline::AlignedBuffer (lib/src/env/aligned_buffer.h), the
// library's own; tests use it rather than a copy.
#ifndef LIFELINE_TESTS_KIT_TEST_KIT_H_
#define LIFELINE_TESTS_KIT_TEST_KIT_H_

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lib/src/store/checkpoint_layout.h"
#include "lib/src/save/rank_data.h"
#include "lifeline/checkpoint.h"
#include "lifeline/env.h"
#include "lifeline/status.h"

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

// Sets (or, with a null value, unsets) one environment variable for a scope and restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old;
    if (value != nullptr) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (saved_) ::setenv(name_.c_str(), saved_->c_str(), 1);
    else ::unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> saved_;
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

// Whether `s`, its code or its message, mentions `text`: for checking that an error names the
// file, tensor or offset involved.
inline bool StatusMentions(const Status& s, const std::string& text) {
  return s.ToString().find(text) != std::string::npos;
}

// ---- checkpoints scaled down to a test's size -------------------------------------------------
//
// The library's defaults (256 KiB chunks, 8 MiB write blocks, gigabytes of staging) are sized for
// models. A test saves kilobytes, so its chunks and blocks are made small enough that a tensor
// spans several of them and the code at their boundaries runs.

// A Checkpointer at `directory` writing `chunk_bytes` checksum chunks in 4 KiB blocks; everything
// else (the real file system, direct I/O, staging) as the library's defaults.
inline CheckpointerOptions SmallCheckpointerOptions(const std::string& directory, const std::string& run_id,
                                                    uint64_t chunk_bytes) {
  CheckpointerOptions o;
  o.directory = directory;
  o.run_id = run_id;
  o.chunk_bytes = chunk_bytes;
  o.write_block_bytes = 4096;
  return o;
}

// The same for rank `rank` of `world_size` saving to "/ckpt" in `env` (a MemEnv as a rule):
// buffered I/O, as memory has no cache to bypass, and a 1 MiB staging arena rather than a
// reservation of gigabytes per Checkpointer.
inline CheckpointerOptions InMemoryCheckpointerOptions(Env* env, const std::string& run_id, uint64_t chunk_bytes,
                                                       uint32_t rank = 0, uint32_t world_size = 1) {
  CheckpointerOptions o = SmallCheckpointerOptions("/ckpt", run_id, chunk_bytes);
  o.env = env;
  o.rank = rank;
  o.world_size = world_size;
  o.staging_budget_bytes = 1 << 20;
  o.direct_io = false;
  return o;
}

// What a rank writes of `step` when a test drives the saver itself, without a Checkpointer (rank
// 0 of 1 unless set): 1 KiB chunks, 4 KiB blocks, 64 KiB of staging, buffered.
inline RankWriteOptions SmallRankWriteOptions(const std::string& run_id, uint64_t step) {
  RankWriteOptions o;
  o.step = step;
  o.run_id = run_id;
  o.run_hash = RunHash(run_id);
  o.chunk_bytes = 1024;
  o.write_block_bytes = 4096;
  o.memory_budget = 64 << 10;
  o.direct_io = false;
  return o;
}

}  // namespace lifeline::test

#endif  // LIFELINE_TESTS_KIT_TEST_KIT_H_
