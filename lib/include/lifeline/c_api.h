/* The C interface to Lifeline's checkpointing, for languages other than C++.
 *
 * Every function returns LIFELINE_OK (0) or a non-zero lifeline_code; the message of the last
 * failure on the calling thread is lifeline_last_error(). Nothing here calls exit or prints.
 *
 * Thread safety: a lifeline_checkpointer is used by one thread at a time. Distinct handles may be
 * used concurrently (that is how ranks in one process cooperate). */
#ifndef LIFELINE_C_API_H_
#define LIFELINE_C_API_H_

#include "lifeline/export.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Same values as lifeline::StatusCode. */
typedef enum lifeline_code {
  LIFELINE_OK = 0,
  LIFELINE_NOT_FOUND = 1,
  LIFELINE_CORRUPTION = 2,
  LIFELINE_INVALID_ARGUMENT = 3,
  LIFELINE_IO_ERROR = 4,
  LIFELINE_ALREADY_EXISTS = 5,
  LIFELINE_NOT_SUPPORTED = 6,
  LIFELINE_RESOURCE_EXHAUSTED = 7,
  LIFELINE_FAILED_PRECONDITION = 8,
  LIFELINE_ABORTED = 9,
  LIFELINE_UNAVAILABLE = 10,
  LIFELINE_NOT_IN_CHECKPOINT = 11
} lifeline_code;

/* Same values as lifeline::DType and the on-disk dtype codes (formats/SPEC.md). */
typedef enum lifeline_dtype {
  LIFELINE_F64 = 1, LIFELINE_F32 = 2, LIFELINE_F16 = 3, LIFELINE_BF16 = 4,
  LIFELINE_F8E4M3 = 5, LIFELINE_F8E5M2 = 6, LIFELINE_I64 = 7, LIFELINE_I32 = 8,
  LIFELINE_I16 = 9, LIFELINE_I8 = 10, LIFELINE_U8 = 11, LIFELINE_BOOL = 12
} lifeline_dtype;

/* A piece of a global tensor: elements [flat_begin, flat_end) of the box (offsets, shape),
 * packed row-major at `data`. offsets NULL means all zeros; shape NULL means the global shape;
 * flat_end < 0 means the whole box. */
typedef struct lifeline_tensor {
  const char* name;
  lifeline_dtype dtype;
  int32_t ndim;
  const int64_t* global_shape;
  const int64_t* offsets;
  const int64_t* shape;
  int64_t flat_begin;
  int64_t flat_end;
  uint32_t replica_index; /* data-parallel copy index; with replica_count 0 or 1: not replicated */
  uint32_t replica_count;
  void* data;
} lifeline_tensor;

typedef struct lifeline_object {
  const char* name;
  const void* data;
  size_t size;
} lifeline_object;

typedef struct lifeline_options {
  const char* directory;
  uint32_t rank;
  uint32_t world_size;
  const char* run_id;          /* NULL: from the environment */
  uint32_t keep_last;          /* 0 keeps every checkpoint */
  uint64_t chunk_bytes;
  uint64_t save_memory_budget;
  uint64_t load_memory_budget;
  uint32_t queue_depth;
  int32_t direct_io;           /* non-zero: O_DIRECT */
  /* Lazy snapshots and the memory tier (see lifeline::CheckpointerOptions). */
  uint64_t staging_budget_bytes;
  uint32_t staging_slots;
  int32_t skip_when_busy;      /* non-zero: BusyPolicy::kSkip, else kWait */
  uint32_t copy_threads;
  int32_t background_nice;     /* 0: the default (10); negative: same priority as the caller */
  int32_t memory_tier;         /* non-zero: back the staging slots with shared memory */
  const char* memory_tier_directory; /* NULL: the default under /dev/shm */
  int32_t codec;               /* 0 none, 1 zstd, 2 zstd with byte grouping */
  const char* drain_directory; /* NULL: no second level */
  uint32_t drain_keep_last;
} lifeline_options;

/* Phases of a save: same values as lifeline::SavePhase. */
typedef enum lifeline_save_phase {
  LIFELINE_PHASE_COPYING = 0,
  LIFELINE_PHASE_PERSISTING = 1,
  LIFELINE_PHASE_PERSISTED = 2,
  LIFELINE_PHASE_COMMITTED = 3,
  LIFELINE_PHASE_FAILED = 4,
  LIFELINE_PHASE_SKIPPED = 5
} lifeline_save_phase;

typedef struct lifeline_save_progress {
  uint64_t step;
  int32_t phase;               /* lifeline_save_phase */
  int32_t code;                /* lifeline_code of the first error, LIFELINE_OK when none */
  uint64_t bytes_total;
  uint64_t bytes_copied;
  uint64_t bytes_stored;
  double stall_seconds;
  double snapshot_seconds;
  double persist_seconds;
} lifeline_save_progress;

/* A handle on one asynchronous save; see lifeline::SaveTicket. Safe to use from any thread. */
typedef struct lifeline_ticket lifeline_ticket;

typedef struct lifeline_checkpointer lifeline_checkpointer;

/* Fills `options` with the defaults (directory NULL, rank 0 of 1). */
LIFELINE_EXPORT void lifeline_options_init(lifeline_options* options);

LIFELINE_EXPORT int lifeline_open(const lifeline_options* options, lifeline_checkpointer** out);
LIFELINE_EXPORT void lifeline_close(lifeline_checkpointer* checkpointer);

/* Saves this rank's share of `step` and returns once it is persisted (blocking); see
 * lifeline_save_async for the lazy form. */
LIFELINE_EXPORT int lifeline_save(lifeline_checkpointer* checkpointer, uint64_t step, const lifeline_tensor* tensors,
                  size_t num_tensors, const lifeline_object* objects, size_t num_objects,
                  const char* metadata_json);

/* Starts saving this rank's share of `step` and returns at once with a ticket (free it with
 * lifeline_ticket_free; freeing does not cancel the save). The tensors' memory must stay valid
 * and unchanged until lifeline_ticket_wait_snapshot returns; errors are reported by the waits. */
LIFELINE_EXPORT int lifeline_save_async(lifeline_checkpointer* checkpointer, uint64_t step, const lifeline_tensor* tensors,
                        size_t num_tensors, const lifeline_object* objects, size_t num_objects,
                        const char* metadata_json, lifeline_ticket** out);
LIFELINE_EXPORT int lifeline_ticket_wait_snapshot(lifeline_ticket* ticket);
LIFELINE_EXPORT int lifeline_ticket_wait_tensor(lifeline_ticket* ticket, size_t index);
LIFELINE_EXPORT int lifeline_ticket_wait_persisted(lifeline_ticket* ticket);
LIFELINE_EXPORT int lifeline_ticket_wait_committed(lifeline_ticket* ticket, double timeout_seconds);
/* Non-blocking. */
LIFELINE_EXPORT void lifeline_ticket_progress(const lifeline_ticket* ticket, lifeline_save_progress* out);
LIFELINE_EXPORT void lifeline_ticket_free(lifeline_ticket* ticket);

/* Waits until every save started so far is persisted. */
LIFELINE_EXPORT int lifeline_flush(lifeline_checkpointer* checkpointer);

/* Sizes the staging slots for snapshots of these tensors and objects and faults their memory in
 * now (see lifeline::Checkpointer::PrepareStaging); the tensors' contents are not read. */
LIFELINE_EXPORT int lifeline_prepare_staging(lifeline_checkpointer* checkpointer, const lifeline_tensor* tensors, size_t num_tensors,
                             const lifeline_object* objects, size_t num_objects);

LIFELINE_EXPORT int lifeline_wait_for_commit(lifeline_checkpointer* checkpointer, uint64_t step, double timeout_seconds);

/* Loads `step` (or the newest complete checkpoint when step < 0) into the targets. The step
 * loaded goes to *loaded_step (may be NULL). Objects and metadata of this load stay readable
 * through lifeline_loaded_object / lifeline_loaded_metadata until the next load or close. */
LIFELINE_EXPORT int lifeline_load(lifeline_checkpointer* checkpointer, int64_t step, const lifeline_tensor* targets,
                  size_t num_targets, uint64_t* loaded_step);
LIFELINE_EXPORT int lifeline_loaded_object(lifeline_checkpointer* checkpointer, const char* name, const void** data,
                           size_t* size);
LIFELINE_EXPORT const char* lifeline_loaded_metadata(lifeline_checkpointer* checkpointer);

/* LIFELINE_NOT_FOUND when there is no complete checkpoint. */
LIFELINE_EXPORT int lifeline_latest_step(lifeline_checkpointer* checkpointer, uint64_t* step);

/* The message of the calling thread's last failure ("" when none). Valid until its next call. */
LIFELINE_EXPORT const char* lifeline_last_error(void);

/* ---- tracing for the node agent (see lifeline/trace.h) ----------------------------------------
 * Each call records one event in this rank's ring when lifeline-agent launched the process
 * (LIFELINE_AGENT set), and does nothing otherwise. Lock-free, no system call; any thread. */

/* Collective operations, the values of lifeline::trace::Op. */
enum {
  LIFELINE_OP_OTHER = 0,
  LIFELINE_OP_ALLREDUCE = 1,
  LIFELINE_OP_ALLGATHER = 2,
  LIFELINE_OP_REDUCESCATTER = 3,
  LIFELINE_OP_BROADCAST = 4,
  LIFELINE_OP_REDUCE = 5,
  LIFELINE_OP_ALLTOALL = 6,
  LIFELINE_OP_SEND = 7,
  LIFELINE_OP_RECV = 8,
  LIFELINE_OP_BARRIER = 9
};

/* 1 when events reach an agent, else 0. */
LIFELINE_EXPORT int lifeline_trace_active(void);
LIFELINE_EXPORT void lifeline_trace_step_begin(uint64_t step);
LIFELINE_EXPORT void lifeline_trace_step_end(uint64_t step);
/* Enters collective `seq` on communicator `comm` (seq 0: the library counts). Returns the seq
 * to pass to _posted and _end (0 when tracing is inactive). */
LIFELINE_EXPORT uint64_t lifeline_trace_collective_begin(int op, uint64_t bytes, uint32_t comm, uint64_t seq);
LIFELINE_EXPORT void lifeline_trace_collective_posted(uint64_t seq, uint32_t comm);
LIFELINE_EXPORT void lifeline_trace_collective_end(uint64_t seq, uint32_t comm);
LIFELINE_EXPORT void lifeline_trace_heartbeat(void);
/* The process resumed from checkpoint `step`; pass UINT64_MAX when it started fresh. */
LIFELINE_EXPORT void lifeline_trace_process_start(uint64_t resumed_step);
LIFELINE_EXPORT void lifeline_trace_process_exit(void);

/* Training signals (see lifeline::trace::ReportScalar). Scalar ids: the loss and the global
 * gradient norm are fixed; others come from lifeline_trace_register_scalar, which returns -1 (and
 * sets lifeline_last_error) for a name that is not 1-32 characters of A-Z a-z 0-9 _ . : / -. */
enum { LIFELINE_SCALAR_LOSS = 0, LIFELINE_SCALAR_GRAD_NORM = 1 };
LIFELINE_EXPORT int64_t lifeline_trace_register_scalar(const char* name);
/* `value` of scalar `id` for `step` (UINT64_MAX: the current step). */
LIFELINE_EXPORT void lifeline_trace_scalar(uint32_t id, double value, uint64_t step);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* LIFELINE_C_API_H_ */
