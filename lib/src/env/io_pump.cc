#include "lifeline/internal/io_pump.h"

#include <utility>

namespace lifeline {

IoPump::IoPump(IoQueue* queue, OnComplete on_complete)
    : queue_(queue), on_complete_(std::move(on_complete)) {}

IoPump::~IoPump() { Drain().IgnoreError(); }

Status IoPump::Submit(const IoRequest& request) {
  while (first_error_.ok() && !has_room() && pending() > 0) Reap(1);
  if (!first_error_.ok()) return first_error_;
  Status s = queue_->Submit(request);
  if (!s.ok()) Fail(s);
  return first_error_;
}

Status IoPump::WaitSome() {
  if (pending() > 0) Reap(1);
  return first_error_;
}

Status IoPump::Drain() {
  while (pending() > 0) Reap(pending());
  return first_error_;
}

void IoPump::Fail(const Status& failure) {
  if (first_error_.ok() && !failure.ok()) first_error_ = failure;
}

void IoPump::Reap(size_t min_completions) {
  completions_.clear();
  Status s = queue_->Reap(min_completions, &completions_);
  for (const IoCompletion& c : completions_) {
    Fail(c.status);
    if (on_complete_) on_complete_(c);
  }
  if (!s.ok()) {
    broken_ = true;
    Fail(s);
  }
}

}  // namespace lifeline
