#include "lifeline/status.h"

#include <cerrno>
#include <cstring>

namespace lifeline {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kCorruption: return "Corruption";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kIOError: return "IOError";
    case StatusCode::kAlreadyExists: return "AlreadyExists";
    case StatusCode::kNotSupported: return "NotSupported";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case StatusCode::kAborted: return "Aborted";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kNotInCheckpoint: return "NotInCheckpoint";
  }
  return "Unknown";
}

Status::Status(StatusCode code, std::string_view msg) {
  if (code != StatusCode::kOk) rep_ = std::make_shared<Rep>(Rep{code, std::string(msg)});
}

Status Status::Make(StatusCode code, std::string_view a, std::string_view b) {
  std::string msg(a);
  if (!b.empty()) {
    msg.append(": ");
    msg.append(b);
  }
  return Status(code, msg);
}

Status Status::FromErrno(int err, std::string_view context) {
  char buf[128];
  // GNU strerror_r may return a static string instead of filling buf.
  const char* text = strerror_r(err, buf, sizeof(buf));
  StatusCode code = (err == ENOENT) ? StatusCode::kNotFound
                    : (err == EEXIST) ? StatusCode::kAlreadyExists
                    : (err == ENOSPC || err == ENOMEM) ? StatusCode::kResourceExhausted
                                                       : StatusCode::kIOError;
  return Make(code, context, text);
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return rep_ ? rep_->msg : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s = StatusCodeName(rep_->code);
  s.append(": ");
  s.append(rep_->msg);
  return s;
}

Status Status::Annotate(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg.append(": ");
  msg.append(rep_->msg);
  return Status(rep_->code, msg);
}

}  // namespace lifeline
