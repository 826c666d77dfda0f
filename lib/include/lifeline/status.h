// Status and Result<T>: how every fallible operation in Lifeline reports its outcome.
//
// No exception leaves the library. An error carries a code (for programs) and a message that
// names the file, tensor, rank or offset involved (for people).
//
// Thread safety: Status and Result are values; distinct objects may be used from any thread.
#ifndef LIFELINE_STATUS_H_
#define LIFELINE_STATUS_H_

#include "lifeline/export.h"

#include <cassert>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace lifeline {

enum class StatusCode : int {
  kOk = 0,
  kNotFound = 1,           // a checkpoint, step, tensor or file that does not exist
  kCorruption = 2,         // bytes on disk that fail a magic, bound or checksum check
  kInvalidArgument = 3,    // the caller asked for something inconsistent
  kIOError = 4,            // the operating system refused (errno is in the message)
  kAlreadyExists = 5,      // e.g. saving a step that is already committed
  kNotSupported = 6,       // e.g. io_uring forbidden by the sandbox
  kResourceExhausted = 7,  // a memory budget or queue depth that cannot be honoured
  kFailedPrecondition = 8, // an operation issued in the wrong state
  kAborted = 9,            // stopped on purpose (shutdown, simulated crash)
  kUnavailable = 10,       // not now: e.g. a save skipped because the previous one is still persisting
  kNotInCheckpoint = 11,   // a load asked for a tensor the checkpoint does not hold: the caller's
                           // mismatch (a renamed or new parameter), not damage; no fallback cures it
};

LIFELINE_EXPORT const char* StatusCodeName(StatusCode code);

class [[nodiscard]] LIFELINE_EXPORT Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string_view msg);

  static Status OK() { return Status(); }
  static Status NotFound(std::string_view a, std::string_view b = {}) { return Make(StatusCode::kNotFound, a, b); }
  static Status Corruption(std::string_view a, std::string_view b = {}) { return Make(StatusCode::kCorruption, a, b); }
  static Status InvalidArgument(std::string_view a, std::string_view b = {}) { return Make(StatusCode::kInvalidArgument, a, b); }
  static Status IOError(std::string_view a, std::string_view b = {}) { return Make(StatusCode::kIOError, a, b); }
  static Status AlreadyExists(std::string_view a, std::string_view b = {}) { return Make(StatusCode::kAlreadyExists, a, b); }
  static Status NotSupported(std::string_view a, std::string_view b = {}) { return Make(StatusCode::kNotSupported, a, b); }
  static Status ResourceExhausted(std::string_view a, std::string_view b = {}) { return Make(StatusCode::kResourceExhausted, a, b); }
  static Status FailedPrecondition(std::string_view a, std::string_view b = {}) { return Make(StatusCode::kFailedPrecondition, a, b); }
  static Status Aborted(std::string_view a, std::string_view b = {}) { return Make(StatusCode::kAborted, a, b); }
  static Status Unavailable(std::string_view a, std::string_view b = {}) { return Make(StatusCode::kUnavailable, a, b); }
  static Status NotInCheckpoint(std::string_view a, std::string_view b = {}) { return Make(StatusCode::kNotInCheckpoint, a, b); }
  // An I/O error from errno `err`, naming `context` (usually the path).
  static Status FromErrno(int err, std::string_view context);

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  // The message without the code's name; empty for OK.
  const std::string& message() const;
  bool IsNotFound() const { return code() == StatusCode::kNotFound; }
  bool IsCorruption() const { return code() == StatusCode::kCorruption; }
  bool IsAlreadyExists() const { return code() == StatusCode::kAlreadyExists; }
  bool IsNotSupported() const { return code() == StatusCode::kNotSupported; }
  bool IsUnavailable() const { return code() == StatusCode::kUnavailable; }
  bool IsNotInCheckpoint() const { return code() == StatusCode::kNotInCheckpoint; }

  // "Corruption: index-r00001: bad magic".
  std::string ToString() const;

  // The same status with `context` prepended to its message ("while loading step 100: ...").
  Status Annotate(std::string_view context) const;

  // Explicitly discards a status the caller has decided not to act on.
  void IgnoreError() const {}

 private:
  struct Rep {
    StatusCode code;
    std::string msg;
  };
  static Status Make(StatusCode code, std::string_view a, std::string_view b);
  std::shared_ptr<const Rep> rep_;  // null means OK; shared so copies are cheap
};

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    assert(!status_.ok() && "Result constructed from an OK status without a value");
    if (status_.ok()) status_ = Status(StatusCode::kFailedPrecondition, "Result built from OK status");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  T& value() & { assert(ok()); return *value_; }
  const T& value() const& { assert(ok()); return *value_; }
  T&& value() && { assert(ok()); return std::move(*value_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T value_or(T fallback) const& { return ok() ? *value_ : std::move(fallback); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace lifeline

#define LL_CONCAT_INNER_(a, b) a##b
#define LL_CONCAT_(a, b) LL_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` yields a non-OK Status.
#define LL_RETURN_IF_ERROR(expr)                  \
  do {                                            \
    ::lifeline::Status ll_status_ = (expr);       \
    if (!ll_status_.ok()) return ll_status_;      \
  } while (0)

// `lhs = value of expr`, or return its error.
#define LL_ASSIGN_OR_RETURN(lhs, expr) LL_ASSIGN_OR_RETURN_IMPL_(LL_CONCAT_(ll_result_, __LINE__), lhs, expr)
#define LL_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

#endif  // LIFELINE_STATUS_H_
