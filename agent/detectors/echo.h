// Echoes: in a multi-node job one rank's death brings its peers down too (gloo raises when a
// connection closes, NCCL aborts on a remote error), so a failure may be the echo of another one
// and not a fault of its own. The Supervisor (agent/supervisor.h, run by lifeline-agent and
// lifeline-sim alike) holds a failure that may be an echo for the failure grace
// (RendezvousConfig::failure_grace_seconds) and lets the node that failed first name its rank.
// This decides which failures may be echoes.
//
// An echo needs two things: an end a peer's failure can cause, and a place it can reach the rank.
//  - The end: an exit status (a Python exception from the collective) or SIGABRT (NCCL's abort, a
//    failed check); any other signal (SIGKILL of the OOM killer, SIGSEGV) is the rank's own.
//  - The place: a collective. A peer's death reaches a rank only through a collective: the call
//    raises (and Python's trace scope records its end as the exception unwinds), or NCCL's
//    watchdog aborts while it is open. So a rank that died in a step before beginning any
//    collective in it, and inside none (DeadRankDetector's evidence "collective_in_step" and
//    "in_collective" both false), failed on its own, whatever its status: two such failures on two
//    nodes at once are two faults, and both are named. A rank that had begun a collective in its
//    step may be an echo (held, as before), and so may one with no such evidence (it recorded no
//    collectives or no steps).
//
// Thread safety: a pure function.
#ifndef LIFELINE_AGENT_DETECTORS_ECHO_H_
#define LIFELINE_AGENT_DETECTORS_ECHO_H_

#include <functional>
#include <vector>

#include "agent/detector.h"

namespace lifeline::agent {

// Whether `dead` (a "dead" anomaly of DeadRankDetector naming one rank), whose process ended with
// `wait_status` (as waitpid reports it), may be the echo of a failure elsewhere: false when it is
// surely the rank's own and is to be acted on at once.
bool MayBeEcho(const Anomaly& dead, int wait_status);

// The anomalies of the poll in which this node saw the round move (another node is restarting the
// job, and this node is about to stop its ranks). A "dead" anomaly may be the restart's cause
// reaching this node (MayBeEcho): moved to `echoes`, to be logged as an echo. Any other "dead"
// anomaly is a failure of its own at the same moment, independent of the one being restarted for:
// it stays in `anomalies`, to be logged and counted (not acted on: the restart under way covers
// it), so that both of two independent failures are named. Every other anomaly is dropped: its
// ranks are being stopped. `wait_status` gives a rank's waitpid status by its global rank.
void SortFailuresAsTheRoundMoves(std::vector<Anomaly>* anomalies, const std::function<int(int)>& wait_status,
                                 std::vector<Anomaly>* echoes);

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_DETECTORS_ECHO_H_
