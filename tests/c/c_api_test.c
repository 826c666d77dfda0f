/* The C API from C: two ranks save halves of a matrix plus an object, one rank loads the whole,
 * and the errors a C caller sees are codes with messages. Exits non-zero on the first failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lifeline/c_api.h"

#define CHECK(cond, ...)                                          \
  do {                                                            \
    if (!(cond)) {                                                \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);        \
      fprintf(stderr, __VA_ARGS__);                               \
      fprintf(stderr, " (last error: %s)\n", lifeline_last_error()); \
      exit(1);                                                    \
    }                                                             \
  } while (0)

int main(void) {
  char dir[] = "/tmp/lifeline-capi-XXXXXX";
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");

  enum { kRows = 6, kCols = 5 };
  const int64_t global[2] = {kRows, kCols};
  float full[kRows * kCols];
  for (int i = 0; i < kRows * kCols; ++i) full[i] = (float)i * 0.5f;

  for (uint32_t rank = 0; rank < 2; ++rank) {
    lifeline_options o;
    lifeline_options_init(&o);
    o.directory = dir;
    o.rank = rank;
    o.world_size = 2;
    o.run_id = "c-api-test";
    lifeline_checkpointer* c = NULL;
    CHECK(lifeline_open(&o, &c) == LIFELINE_OK, "open rank %u", rank);
    const int64_t offsets[2] = {rank * 3, 0};
    const int64_t shape[2] = {3, kCols};
    lifeline_tensor t = {"w", LIFELINE_F32, 2, global, offsets, shape, 0, -1, 0, 1, full + rank * 3 * kCols};
    char rng[16];
    snprintf(rng, sizeof(rng), "rng-of-%u", rank);
    lifeline_object obj = {"rng", rng, strlen(rng)};
    CHECK(lifeline_save(c, 7, &t, 1, &obj, 1, rank == 0 ? "{\"model\":\"c\"}" : NULL) == LIFELINE_OK, "save rank %u", rank);
    lifeline_close(c);
  }

  lifeline_options o;
  lifeline_options_init(&o);
  o.directory = dir;
  o.rank = 1; /* a single loader that asks for rank 1's objects by being rank 1 of 2 */
  o.world_size = 2;
  lifeline_checkpointer* c = NULL;
  CHECK(lifeline_open(&o, &c) == LIFELINE_OK, "open loader");
  uint64_t latest = 0;
  CHECK(lifeline_latest_step(c, &latest) == LIFELINE_OK && latest == 7, "latest step is 7, got %llu",
        (unsigned long long)latest);

  float got[kRows * kCols];
  memset(got, 0, sizeof(got));
  lifeline_tensor whole = {"w", LIFELINE_F32, 2, global, NULL, NULL, 0, -1, 0, 0, got};
  uint64_t step = 0;
  CHECK(lifeline_load(c, -1, &whole, 1, &step) == LIFELINE_OK && step == 7, "load newest");
  CHECK(memcmp(got, full, sizeof(full)) == 0, "loaded matrix equals the saved halves");
  const void* data = NULL;
  size_t size = 0;
  CHECK(lifeline_loaded_object(c, "rng", &data, &size) == LIFELINE_OK, "object rng");
  CHECK(size == strlen("rng-of-1") && memcmp(data, "rng-of-1", size) == 0, "rank 1's object");
  CHECK(strcmp(lifeline_loaded_metadata(c), "{\"model\":\"c\"}") == 0, "metadata of rank 0");

  /* Errors are codes plus a message naming what is wrong. */
  lifeline_tensor missing = {"no_such_tensor", LIFELINE_F32, 2, global, NULL, NULL, 0, -1, 0, 0, got};
  CHECK(lifeline_load(c, 7, &missing, 1, NULL) == LIFELINE_NOT_IN_CHECKPOINT, "missing tensor is NOT_IN_CHECKPOINT");
  CHECK(strstr(lifeline_last_error(), "no_such_tensor") != NULL, "message names the tensor");
  const int64_t wrong_shape[2] = {kRows, kCols + 1};
  lifeline_tensor wrong = {"w", LIFELINE_F32, 2, wrong_shape, NULL, NULL, 0, -1, 0, 0, got};
  CHECK(lifeline_load(c, 7, &wrong, 1, NULL) == LIFELINE_INVALID_ARGUMENT, "shape mismatch is INVALID_ARGUMENT");
  CHECK(lifeline_load(c, 8, &whole, 1, NULL) == LIFELINE_NOT_FOUND, "absent step is NOT_FOUND");
  lifeline_tensor again = {"w", LIFELINE_F32, 2, global, NULL, NULL, 0, -1, 0, 0, full};
  /* Without a launch id a multi-rank save is refused, saying how to set one. */
  CHECK(lifeline_save(c, 7, &again, 1, NULL, 0, NULL) == LIFELINE_FAILED_PRECONDITION, "a save without a launch id");
  CHECK(strstr(lifeline_last_error(), "run_id") != NULL, "message says how to set a launch id");
  lifeline_close(c);
  o.run_id = "c-api-loader";
  CHECK(lifeline_open(&o, &c) == LIFELINE_OK, "reopen with a launch id");
  CHECK(lifeline_save(c, 7, &again, 1, NULL, 0, NULL) == LIFELINE_ALREADY_EXISTS, "re-saving a committed step");
  lifeline_close(c);

  /* The lazy form: the buffer may change once the snapshot is taken; the checkpoint keeps the
   * values it had at the call. */
  lifeline_options_init(&o);
  o.directory = dir;
  o.run_id = "c-api-async";
  CHECK(lifeline_open(&o, &c) == LIFELINE_OK, "open async saver");
  float live[kRows * kCols];
  memcpy(live, full, sizeof(full));
  lifeline_tensor lt = {"w", LIFELINE_F32, 2, global, NULL, NULL, 0, -1, 0, 0, live};
  CHECK(lifeline_prepare_staging(c, &lt, 1, NULL, 0) == LIFELINE_OK, "prepare_staging: %s", lifeline_last_error());
  lifeline_ticket* ticket = NULL;
  CHECK(lifeline_save_async(c, 9, &lt, 1, NULL, 0, NULL, &ticket) == LIFELINE_OK, "save_async");
  CHECK(lifeline_ticket_wait_tensor(ticket, 0) == LIFELINE_OK, "wait_tensor");
  CHECK(lifeline_ticket_wait_snapshot(ticket) == LIFELINE_OK, "wait_snapshot");
  for (int i = 0; i < kRows * kCols; ++i) live[i] = -1.0f;
  CHECK(lifeline_ticket_wait_committed(ticket, 30) == LIFELINE_OK, "wait_committed: %s", lifeline_last_error());
  lifeline_save_progress progress;
  lifeline_ticket_progress(ticket, &progress);
  CHECK(progress.step == 9 && progress.phase == LIFELINE_PHASE_COMMITTED && progress.code == LIFELINE_OK &&
            progress.bytes_total == sizeof(full) + 0 && progress.bytes_copied == sizeof(full),
        "progress of a committed save (phase %d, %llu bytes)", progress.phase, (unsigned long long)progress.bytes_total);
  CHECK(lifeline_ticket_wait_tensor(ticket, 1) == LIFELINE_INVALID_ARGUMENT, "wait_tensor out of range");
  lifeline_ticket_free(ticket);
  lifeline_ticket* repeat = NULL;
  CHECK(lifeline_save_async(c, 9, &lt, 1, NULL, 0, NULL, &repeat) == LIFELINE_OK, "save_async of a committed step");
  CHECK(lifeline_ticket_wait_persisted(repeat) == LIFELINE_ALREADY_EXISTS, "its error comes from the ticket");
  lifeline_ticket_free(repeat);
  CHECK(lifeline_flush(c) == LIFELINE_ALREADY_EXISTS, "flush reports it too");
  memset(got, 0, sizeof(got));
  CHECK(lifeline_load(c, 9, &whole, 1, &step) == LIFELINE_OK && step == 9, "load step 9");
  CHECK(memcmp(got, full, sizeof(full)) == 0, "step 9 holds the values at save time");
  lifeline_close(c);

  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  if (system(cmd) != 0) return 1;
  printf("c_api_test: ok\n");
    /* Without an agent, tracing is off and costs nothing: calls are accepted and record nothing. */
  CHECK(lifeline_trace_active() == 0, "tracing inactive without LIFELINE_AGENT");
  lifeline_trace_step_begin(1);
  CHECK(lifeline_trace_collective_begin(LIFELINE_OP_ALLREDUCE, 64, 0, 0) == 0, "no seq without an agent");
  lifeline_trace_step_end(1);
  return 0;
}
