// lifeline bench trace: what recording one trace event costs the training thread.
//
// Runs in this process, with a ring of its own in a scratch directory standing in for the
// agent's, and a consumer thread draining it every millisecond as the agent does:
//   event       StepBegin, the cheapest event (a timestamp and one ring slot), --events times;
//   collective  CollectiveBegin + CollectiveEnd pairs, per event (the library counts the seq);
//   threads     the same events from --threads threads at once (wall time per event per thread);
// each timed in batches of half the ring, the consumer emptying the ring between batches
// (untimed), so what is timed is the steady state of a ring that keeps up: nothing dropped;
// against two baselines measured in the same run: clock_gettime(CLOCK_MONOTONIC) alone (every
// event needs one timestamp), and the calls with no agent present (a forked child without
// LIFELINE_AGENT: the price a job pays for leaving the calls in).
//
// --json fields: events, threads, ns_per_event, ns_per_collective_event, ns_per_event_threads,
// ns_clock, ns_inactive, ratio_to_clock (ns_per_event / ns_clock), dropped (events the ring
// refused; 0 unless the consumer fell behind), ring_events.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "lifeline/internal/trace_ring.h"
#include "lifeline/trace.h"
#include "tools/lifeline/bench/bench.h"
#include "tools/lifeline/commands.h"

namespace lifeline::cli {
namespace {

using trace::TraceRing;

struct TraceOptions {
  uint64_t events = 2000000;
  unsigned threads = 2;
  uint64_t ring_events = 1 << 16;
  bool json = false;
};

double NsPer(double seconds, uint64_t n) { return n == 0 ? 0 : seconds * 1e9 / static_cast<double>(n); }

double TimeSteps(uint64_t n) {
  const double t0 = NowSeconds();
  for (uint64_t i = 0; i < n; ++i) trace::StepBegin(i);
  return NowSeconds() - t0;
}

// Times `n` events recorded by `record` in batches of half the ring, waiting between batches
// (untimed) until the consumer has drained the ring: the steady state of a ring that keeps up,
// where no event is dropped and every slot is already mapped.
template <typename F>
double TimeBatches(trace::TraceRing& ring, uint64_t n, F record) {
  const uint64_t batch = std::max<uint64_t>(1, ring.capacity() / 2);
  double seconds = 0;
  for (uint64_t done = 0; done < n;) {
    while (ring.header()->tail.load() != ring.header()->head.load()) std::this_thread::yield();
    const uint64_t k = std::min(batch, n - done);
    const double t0 = NowSeconds();
    record(k);
    seconds += NowSeconds() - t0;
    done += k;
  }
  return seconds;
}

// The inactive cost, in a child that never saw LIFELINE_AGENT (the state is latched per process).
Result<double> InactiveNs(uint64_t n) {
  int fds[2];
  if (pipe(fds) != 0) return Status::FromErrno(errno, "bench trace: pipe");
  const pid_t pid = fork();
  if (pid < 0) return Status::FromErrno(errno, "bench trace: fork");
  if (pid == 0) {
    close(fds[0]);
    unsetenv("LIFELINE_AGENT");
    trace::StepBegin(0);  // latches "inactive"
    const double ns = NsPer(TimeSteps(n), n);
    (void)!write(fds[1], &ns, sizeof(ns));
    _exit(0);
  }
  close(fds[1]);
  double ns = 0;
  const ssize_t got = read(fds[0], &ns, sizeof(ns));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (got != sizeof(ns)) return Status::IOError("bench trace", "the child measuring the inactive cost failed");
  return ns;
}

int RunTrace(const TraceOptions& o) {
  const char* kCommand = "bench trace";
  // Measured first: the child must not inherit a live tracer.
  Result<double> inactive = InactiveNs(o.events);
  if (!inactive.ok()) return ReportFailure(kCommand, inactive.status(), o.json);

  char tmpl[] = "/tmp/lifeline-bench-trace-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return ReportFailure(kCommand, Status::FromErrno(errno, "mkdtemp"), o.json);
  const std::string dir = tmpl;
  auto ring = trace::TraceRing::Create(trace::RingPath(dir, 0), 0, o.ring_events);
  if (!ring.ok()) return ReportFailure(kCommand, ring.status(), o.json);
  setenv("LIFELINE_AGENT", dir.c_str(), 1);
  setenv("RANK", "0", 1);
  setenv("LIFELINE_DUMP_SIGNAL", "0", 1);
  if (!trace::Active()) {
    std::filesystem::remove_all(dir);
    return ReportFailure(kCommand,
                         Status::FailedPrecondition(kCommand, "tracing did not start (was it used before in this process?)"),
                         o.json);
  }
  std::atomic<bool> stop{false};
  std::thread consumer([&] {
    std::vector<trace::Event> sink;
    sink.reserve((*ring)->capacity());
    while (!stop.load(std::memory_order_relaxed)) {
      sink.clear();
      (*ring)->Drain(&sink);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });

  // clock_gettime alone.
  uint64_t sum = 0;
  double t0 = NowSeconds();
  for (uint64_t i = 0; i < o.events; ++i) sum += trace::MonotonicNanos();
  const double clock_ns = NsPer(NowSeconds() - t0, o.events);

  TraceRing& r = **ring;
  TimeBatches(r, r.capacity(), TimeSteps);  // maps every slot
  const double event_ns = NsPer(TimeBatches(r, o.events, TimeSteps), o.events);
  const double collective_ns = NsPer(TimeBatches(r, o.events,
                                                 [](uint64_t k) {
                                                   for (uint64_t i = 0; i < k / 2; ++i)
                                                     trace::CollectiveEnd(trace::CollectiveBegin(trace::Op::kAllReduce, 4096));
                                                   return 0.0;
                                                 }),
                                     o.events / 2 * 2);

  // Several producers at once: each records its share of every batch.
  const double threads_seconds = TimeBatches(r, o.events * o.threads, [&](uint64_t k) {
    std::vector<std::thread> producers;
    for (unsigned t = 0; t < o.threads; ++t) producers.emplace_back([&] { TimeSteps(k / o.threads); });
    for (auto& p : producers) p.join();
    return 0.0;
  });
  // Per event per thread: the wall time of a batch spread over the events each thread recorded.
  const double threads_ns = NsPer(threads_seconds, o.events);

  stop.store(true);
  consumer.join();
  const uint64_t dropped = trace::Dropped();
  std::filesystem::remove_all(dir);
  if (sum == 42) std::cerr << "";  // keeps the clock loop

  if (o.json) {
    PrintJson({{"ok", true},
               {"command", kCommand},
               {"events", o.events},
               {"threads", o.threads},
               {"ring_events", (*ring)->capacity()},
               {"ns_per_event", event_ns},
               {"ns_per_collective_event", collective_ns},
               {"ns_per_event_threads", threads_ns},
               {"ns_clock", clock_ns},
               {"ns_inactive", *inactive},
               {"ratio_to_clock", clock_ns > 0 ? event_ns / clock_ns : 0},
               {"dropped", dropped}});
  } else {
    std::printf("trace events (ring of %llu events, drained every 0.2 ms):\n", static_cast<unsigned long long>((*ring)->capacity()));
    std::printf("  step event               %7.1f ns  (%.2fx clock_gettime, %.1f ns)\n", event_ns,
                clock_ns > 0 ? event_ns / clock_ns : 0, clock_ns);
    std::printf("  collective begin/end     %7.1f ns per event\n", collective_ns);
    std::printf("  %u threads at once        %7.1f ns per event per thread\n", o.threads, threads_ns);
    std::printf("  without an agent         %7.1f ns per call\n", *inactive);
    std::printf("  dropped (ring full)      %llu\n", static_cast<unsigned long long>(dropped));
  }
  return kExitOk;
}

}  // namespace

void AddBenchTraceCommand(CLI::App* bench, std::vector<Command>* commands) {
  auto o = std::make_shared<TraceOptions>();
  CLI::App* app = bench->add_subcommand("trace", "Cost of one trace event on the training thread (target: 100 ns or less)");
  app->add_option("--events", o->events, "Events per measurement (default 2000000)")->check(CLI::PositiveNumber);
  app->add_option("--threads", o->threads, "Producer threads for the concurrent measurement (default 2)")
      ->check(CLI::Range(1, 64));
  app->add_option("--ring-events", o->ring_events, "Ring capacity in events (default 65536)")->check(CLI::PositiveNumber);
  app->add_flag("--json", o->json, "Print one JSON object on stdout");
  commands->push_back(Command{app, [o] { return RunTrace(*o); }});
}

}  // namespace lifeline::cli
