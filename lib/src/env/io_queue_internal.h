// Internal declarations shared by the files of the env module (not part of the public API).
#ifndef LIFELINE_SRC_ENV_IO_QUEUE_INTERNAL_H_
#define LIFELINE_SRC_ENV_IO_QUEUE_INTERNAL_H_

#include <memory>
#include <string>

#include "lifeline/env.h"
#include "lifeline/status.h"

namespace lifeline {
namespace internal {

// An io_uring queue. NotSupported (with the kernel's reason) when io_uring cannot be set up here,
// InvalidArgument when options.depth is beyond what a ring can hold (32768). Requests whose file
// has no descriptor (fd() < 0) are executed synchronously inside Submit.
Result<std::unique_ptr<IoQueue>> NewUringIoQueue(const IoQueueOptions& options);

// The queue Env::Default() hands out: honours LIFELINE_IO_ENGINE ("threads", "uring"/"io_uring",
// unset or "auto": io_uring with a one-time warning and the thread pool when it is unavailable).
Result<std::unique_ptr<IoQueue>> NewPosixIoQueue(const IoQueueOptions& options);

// " at offset N": the suffix every positional I/O error carries after the path.
std::string AtOffset(uint64_t offset);

// Test hook: while set, PosixEnv behaves as if every file system refused O_DIRECT (EINVAL at
// open), so the buffered fallback can be exercised on kernels whose tmpfs accepts O_DIRECT.
void SetDirectIoRefusedForTesting(bool refused);

// Test hook: while `err` is non-zero, setting up an io_uring fails as if the kernel had answered
// -err (EPERM in a locked-down container, ENOSYS on an old kernel); 0 restores the real kernel.
void SetUringUnavailableForTesting(int err);

}  // namespace internal
}  // namespace lifeline

#endif  // LIFELINE_SRC_ENV_IO_QUEUE_INTERNAL_H_
