// An Env over an S3 bucket: paths "s3://bucket/prefix/dir/file" name objects, and every path the Env
// is given must lie at or below its root ("s3://bucket/prefix"), so nothing outside the prefix is
// ever written, read, listed or deleted (InvalidArgument naming the path otherwise).
//
// What the object store gives in place of a file system, operation by operation:
//   NewWritableFile   nothing is visible until Close succeeds, and then the whole object at once.
//                     Writes of at least part_bytes are uploaded at once as parts of a multipart
//                     upload, straight from the caller's buffer (no copy), from whichever threads
//                     call WriteAt (the IoQueue's); smaller writes are copied and sent at Close (a
//                     single PUT when nothing was uploaded before). A failed part, a failed Close or
//                     a file destroyed unclosed aborts the upload: no object, no parts left behind.
//                     Sync does nothing (durability comes with Close). Allocate(size) tells the
//                     expected size: parts are sized so that 10000 cover it, and the last 4096 bytes
//                     before `size` are held back, so that a Truncate dropping direct-I/O padding
//                     never cuts an uploaded part. Truncate below the end of an uploaded part is
//                     NotSupported. Writes must not overlap.
//   NewRandomAccessFile  one HEAD at open (NotFound when absent); ReadAt is a ranged GET of exactly
//                     the bytes asked for.
//   GetChildren       a listing with delimiter '/': objects and "subdirectories" (common prefixes).
//                     A prefix with nothing below it is an empty directory, not NotFound.
//   CreateDir, SyncDir  nothing to do: prefixes exist while objects do. OK.
//   IsDirectory       true for the root and its ancestors, and for a prefix with objects below it.
//   RemoveDir         OK when nothing is below the prefix, FailedPrecondition otherwise.
//   RemoveFile        HEAD then DELETE (NotFound when absent, as POSIX).
//   RemoveTree        deletes the object and every key below "path/", in parallel.
//   RenameFile        server-side copy then delete: not atomic; a reader may briefly see both.
//   RenameFileNoReplace  a conditional PUT (If-None-Match: *) of the source's bytes (at most 64 MiB),
//                     then delete: AlreadyExists, the source kept, when the target exists with other
//                     bytes (a retry that finds the object its own lost answer created is OK).
//   LockFile          a lock object created by a conditional PUT and deleted when the FileLock is
//                     destroyed. Unlike a kernel lock it outlives a holder that dies: the holder
//                     text (LockHolder) says who took it, and a caller decides when it is stale. The
//                     object is created holding a random claim token, so that a claim whose answer
//                     was lost is still known to be ours.
//   PutFile           one PUT of the whole object (If-None-Match: * when not replacing, with the
//                     retry rule of RenameFileNoReplace): no temporary object, no copy.
//   AbortIncompleteWrites  AbortIncompleteUploads.
//   NewIoQueue        the thread-pool queue (at least min(depth, 16) threads): each request is one
//                     part upload or ranged GET.
//
// Thread safety: as Env. A WritableFile's WriteAt may be called from several threads at once.
#ifndef LIFELINE_SRC_ENV_S3_ENV_H_
#define LIFELINE_SRC_ENV_S3_ENV_H_

#include <memory>
#include <string>

#include "lib/src/env/s3_client.h"
#include "lib/src/env/s3_url.h"
#include "lifeline/env.h"

namespace lifeline {

struct S3EnvOptions {
  // "s3://bucket[/prefix]": the part of the bucket this Env may touch.
  std::string root;
  // The smallest write uploaded as its own part (at least 5 MiB, S3's minimum part size); also the
  // size of the parts Close makes of copied bytes.
  uint64_t part_bytes = 8ull << 20;
  // Threads RemoveTree deletes with.
  unsigned delete_threads = 8;
};

class S3Env : public Env {
 public:
  // `client` is shared by every file of the Env. InvalidArgument for a root that is not an s3://
  // path or a part size below 5 MiB. Does not contact the store.
  static Result<std::unique_ptr<S3Env>> Open(std::shared_ptr<S3Client> client, const S3EnvOptions& options);

  virtual S3Client* client() const = 0;
  virtual const S3Location& root() const = 0;
  // Aborts every multipart upload begun under `path` (at or below the root) and not completed: the
  // leftovers of saves that died mid-upload. Returns how many it aborted. Never call it while a
  // save under `path` is still uploading.
  virtual Result<size_t> AbortIncompleteUploads(const std::string& path) = 0;
};

}  // namespace lifeline

#endif  // LIFELINE_SRC_ENV_S3_ENV_H_
