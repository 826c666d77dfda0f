#!/usr/bin/env python3
"""Detection and resume times of a multi-node job, measured from the agents' events logs.

Starts Debian's etcd on loopback (free ports, a temporary data directory) and runs lifeline-drill
under two lifeline-agents, each a node of 2 ranks with its own memory tier, TRIALS times per fault:

    crash   rank 3 (node 1) SIGKILLs itself at step 50
    hang    rank 3 (node 1) stops before the allreduce of step 110 (--hang-timeout 5)
    lost    node 1 (its agent and ranks) SIGKILLed after step 100; --nnodes 1:2, lease 3 s,
            last call 1 s: node 0 goes on alone, resharding the 4-rank checkpoint to 2 ranks

and prints, per fault, the distribution (median, max) of
    detect   crash: the culprit's last event to the verdict (culprit_silent_seconds);
             hang: the time the job waited in the collective (evidence.waited_seconds);
             lost: the SIGKILL to node 0's node_lost verdict (wall clock of the events log)
    resume   the verdict to every rank of the next round beginning a step (seconds_since_detection
             of the "resumed" action, the slowest node)

    tools/multinode_figures.py build/bin/lifeline-agent build/bin/lifeline-drill [--trials 5]

With --overhead it instead measures what snapshot replication costs training: the same clean job
with replication on and off, TRIALS times each, alternately, and prints the median ms/step of each
and their ratio. --job drill (the default): lifeline-drill, --params floats per rank (default
4000000), a checkpoint every --ckpt-every steps (default 50) of 5 ms, ms/step from its progress
lines. --job train_gpt: tools/train_gpt.py under Debian's /usr/bin/python3 (torch) over gloo, a GPT
of d_model 256 and 4 layers (about 10 MB of checkpoint per rank), 50 steps, a checkpoint every
--ckpt-every steps (default 5); ms/step from when rank 0's "step S" lines reached this script, per
window of --ckpt-every steps (each holding one checkpoint) after the first 10 steps; the lifeline
package is the one beside the agent (build/bin/lifeline-agent -> build/python, where the agent finds
its Python startup hook). Either way every node of an 'on' run must log "replicated" actions.

    tools/multinode_figures.py build/bin/lifeline-agent build/bin/lifeline-drill --overhead [--job train_gpt]

With --recovery it measures how a replacement node recovers the job after a node is lost, TRIALS
times each way, alternately: lifeline-drill on two nodes (--params floats per rank, default
16000000: 128 MB of state per rank, of which each rank writes a quarter to disk; a checkpoint every
10 steps of 20 ms; etcd lease 3 s); node 1 (agent and ranks) is SIGKILLed and a replacement node 1,
its memory empty, started at once. Two ways:
    peer memory  node 1 goes right after it logs "replicated" for a step S >= 30, and the disk loses
                 every step from S on: the replacement receives S from node 0's memory
    disk         replication disabled on both nodes; node 1 goes right after a step S >= 30 is
                 committed on disk, which keeps it: every rank resumes from the disk
After the kill the checkpoint files are dropped from the page cache (posix_fadvise), as a new machine
would find them (--warm-disk leaves them). It prints, per way, the median (and max) seconds
    kill->node_lost    the SIGKILL to node 0's node_lost verdict
    node_lost->launch  the verdict to the replacement launching its ranks (the new round's
                       rendezvous and, from peer memory, the transfer of step S)
    launch->resumed    that launch to every rank of the job beginning a step (node 0's "resumed"
                       action: the ranks load their state, then meet)
    start->resumed     the replacement's start to that; kill->resumed: the SIGKILL to that
and the bytes and seconds of the transfer ("sent_resume_step" on node 0; "fetched_resume_step" on
the replacement: its wait for the step, from its launch plan on).

    tools/multinode_figures.py build/bin/lifeline-agent build/bin/lifeline-drill --recovery [--trials 3]

The nodes' memory tiers (LIFELINE_MEMORY_TIER_DIR) are directories under /dev/shm, as a node's would
be; checkpoints and logs go to a temporary directory, removed at the end unless a trial failed.
"""

import argparse
import datetime
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_etcd(directory):
    binary = shutil.which("etcd") or "/usr/bin/etcd"
    client, peer = free_port(), free_port()
    endpoint = f"127.0.0.1:{client}"
    log = open(os.path.join(directory, "etcd.log"), "w")
    proc = subprocess.Popen(
        [binary, "--name", "figures", "--data-dir", os.path.join(directory, "etcd"),
         "--listen-client-urls", f"http://{endpoint}", "--advertise-client-urls", f"http://{endpoint}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls",
         f"http://127.0.0.1:{peer}", "--initial-cluster", f"figures=http://127.0.0.1:{peer}"],
        stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", client), timeout=0.2):
                return proc, endpoint
        except OSError:
            time.sleep(0.05)
    proc.kill()
    sys.exit(f"etcd did not start on {endpoint}")


def events(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def iso_seconds(text):
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


TRAIN_GPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_gpt.py")
PYTHON = "/usr/bin/python3"  # Debian's, which has torch
TRAIN_GPT_MODEL = ["--d-model", "256", "--layers", "4", "--heads", "4"]

# Every agent started, so that one left running by a failed trial is stopped at the end.
STARTED = []


def copy_stamped(pipe, out):
    """Copies an agent's output to the file `out`, each line prefixed with the wall-clock time it arrived."""
    with out:
        for line in pipe:
            out.write(f"{time.time():.3f} {line}")


def finish(proc, timeout, what):
    """Waits for an agent and for the copy of its output; exits naming `what` unless it succeeded."""
    if proc.wait(timeout=timeout) != 0:
        sys.exit(f"{what} exited {proc.returncode}; see {os.path.dirname(proc.out)}")
    proc.reader.join()


def wait_until(found, what, timeout=120):
    """Polls `found` (a function returning a true value once it holds) and returns that value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(0.02)
    sys.exit(f"not within {timeout} s: {what}")


class Trial:
    def __init__(self, args, endpoint, directory, name, job="drill"):
        self.args, self.endpoint, self.dir, self.name, self.job = args, endpoint, directory, name, job
        self.ckpt = os.path.join(self.dir, self.name + ".ckpt")

    def agent(self, node, agent_flags, job_flags, nnodes="2", node_rank=None):
        """Node `node` of the job (its log, output and memory tier), as GROUP_RANK `node_rank`
        (default `node`): a replacement is a new node in the place of an old one."""
        cmd = [self.args.agent, "run", "--nnodes", nnodes, "--nproc-per-node", "2", "--rdzv-endpoint",
               self.endpoint, "--rdzv-id", self.name, "--node-rank", str(node if node_rank is None else node_rank),
               "--hang-timeout", "5", "--max-restarts", "2", "--events-log", self.log(node), "--checkpoint-dir",
               self.ckpt] + agent_flags + ["--"]
        cmd += [PYTHON, TRAIN_GPT] if self.job == "train_gpt" else [self.args.drill]
        cmd += ["--dir", self.ckpt] + job_flags
        env = dict(os.environ, LIFELINE_MEMORY_TIER_DIR=os.path.join(self.args.tiers, f"{self.name}.tier{node}"))
        if self.job == "train_gpt":  # the lifeline package beside the agent: build/bin -> build/python
            env["PYTHONPATH"] = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(self.args.agent))),
                                             "python")
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", start_new_session=True)
        proc.out = self.out(node)
        out = open(proc.out, "w", buffering=1)  # there from the start, for those who poll it
        proc.reader = threading.Thread(target=copy_stamped, args=(proc.stdout, out), daemon=True)
        proc.reader.start()
        STARTED.append(proc)
        return proc

    def kill(self, node, proc):
        """SIGKILLs node `node`: its agent and its ranks (each leads its own process group), as a
        machine that goes away. Returns the wall-clock time of the kill."""
        os.killpg(proc.pid, signal.SIGKILL)  # the agent's group
        for e in events(self.log(node)):
            if e.get("action") == "launch":
                for pid in e["pids"]:
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        killed_at = time.time()
        proc.wait()
        proc.reader.join()
        return killed_at

    def log(self, node):
        return os.path.join(self.dir, f"{self.name}.{node}.events")

    def out(self, node):
        return os.path.join(self.dir, f"{self.name}.{node}.out")

    def output(self, node):
        with open(self.out(node)) as f:
            return f.read()


def resume_seconds(logs):
    times = [e["seconds_since_detection"] for log in logs for e in log if e.get("action") == "resumed"]
    return max(times) if times else None


def run_fault(args, endpoint, directory, fault, i):
    t = Trial(args, endpoint, directory, f"{fault}{i}")
    steps = ["--steps", "400", "--ckpt-every", "20", "--quiet"]
    if fault in ("crash", "hang"):
        drill = steps + ["--fault", "crash@3:50" if fault == "crash" else "hang@3:110"]
        procs = [t.agent(n, [], drill) for n in range(2)]
        for p in procs:
            finish(p, 300, f"{t.name}: an agent")
        logs = [events(t.log(n)) for n in range(2)]
        verdicts = [e for log in logs for e in log if e.get("kind") == ("dead" if fault == "crash" else "hang")]
        if not verdicts or verdicts[0]["ranks"] != [3]:
            sys.exit(f"{t.name}: expected rank 3 to be named: {verdicts}")
        v = verdicts[0]
        detect = v["culprit_silent_seconds"] if fault == "crash" else v["evidence"]["waited_seconds"]
        return detect, resume_seconds(logs)
    # lost: node 1 goes, node 0 goes on alone
    config = os.path.join(directory, "elastic.yaml")
    with open(config, "w") as f:
        f.write("rendezvous:\n  lease_seconds: 3\n  last_call_seconds: 1\n")
    drill = ["--steps", "1500", "--ckpt-every", "50", "--compute-ms", "2"]
    procs = [t.agent(n, ["--config", config], drill, nnodes="1:2") for n in range(2)]
    # past a checkpoint, so that the survivor resumes from one
    wait_until(lambda: "checkpoint step=100" in t.output(1), f"{t.name}: node 1 checkpointing step 100")
    killed_at = t.kill(1, procs[1])
    finish(procs[0], 300, f"{t.name}: node 0")
    log = events(t.log(0))
    lost = [e for e in log if e.get("kind") == "node_lost"]
    if not lost or lost[0]["ranks"] != [2, 3]:
        sys.exit(f"{t.name}: expected node_lost naming ranks 2,3: {lost}")
    return iso_seconds(lost[0]["time"]) - killed_at, resume_seconds([log])


def step_ms(path):
    """The drill's progress lines ("step K/S X ms/step ...") of one node's output, after the first."""
    values = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if "ms/step" in parts:
                values.append(float(parts[parts.index("ms/step") - 1]))
    return values[1:]


def train_gpt_step_ms(path, every, skip=10):
    """ms/step of train_gpt per window of `every` steps after the first `skip`, from the times
    rank 0's lines "step S loss L" reached this script (so each window holds one checkpoint)."""
    arrived = {}
    with open(path) as f:
        for line in f:
            parts = line.split()  # TIME [rank 0] step S loss L
            if parts[1:4] == ["[rank", "0]", "step"] and parts[5:6] == ["loss"]:
                arrived[int(parts[4])] = float(parts[0])
    return [(arrived[s + every] - arrived[s]) * 1e3 / every
            for s in range(skip, max(arrived, default=0) - every + 1, every) if s in arrived and s + every in arrived]


def checkpoint_mb_per_rank(ckpt, ranks=4):
    """The newest committed step's size on disk, per rank, in 10^6 bytes."""
    committed = committed_steps(ckpt)
    step_dir = os.path.join(ckpt, committed[max(committed)])
    return sum(os.path.getsize(os.path.join(step_dir, n)) for n in os.listdir(step_dir)) / ranks / 1e6


def committed_steps(ckpt):
    """Step -> directory name of each step in `ckpt` whose global manifest (its commit) is written."""
    steps = {}
    for name in os.listdir(ckpt) if os.path.isdir(ckpt) else []:
        try:
            if name.startswith("step-") and any(n.endswith(".manifest") for n in os.listdir(os.path.join(ckpt, name))):
                steps[int(name[5:])] = name
        except (ValueError, OSError):  # not a step, or removed meanwhile by keep_last
            pass
    return steps


def evict(directory):
    """Drops the files under `directory` from the page cache, so that they are read from the disk
    again, as a new machine (or one whose cache has moved on) would read them."""
    for root, _, names in os.walk(directory):
        for name in names:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
            except OSError:  # removed meanwhile by keep_last
                continue
            try:
                os.fsync(fd)  # dirty pages stay cached until written
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def replication_config(directory, on, lease=False):
    path = os.path.join(directory, f"replication-{'on' if on else 'off'}{'-lease' if lease else ''}.yaml")
    with open(path, "w") as f:
        f.write(f"replication:\n  enabled: {'true' if on else 'false'}\n")
        if lease:  # a lost node is noticed in 3 s; the replacement may take its time to come
            f.write("rendezvous:\n  lease_seconds: 3\n  join_timeout_seconds: 120\n")
    return path


def run_overhead(args, endpoint, directory):
    gpt = args.job == "train_gpt"
    every = args.ckpt_every or (5 if gpt else 50)
    if gpt:
        flags = ["--steps", "50", "--ckpt-every", str(every)] + TRAIN_GPT_MODEL
    else:
        flags = ["--steps", "1000", "--ckpt-every", str(every), "--params", str(args.params), "--compute-ms", "5"]
    results = {"on": [], "off": []}
    for i in range(args.trials):
        for mode in ("on", "off"):
            t = Trial(args, endpoint, directory, f"over{mode}{i}", job=args.job)
            procs = [t.agent(n, ["--config", replication_config(directory, mode == "on")], flags) for n in range(2)]
            for p in procs:
                finish(p, 600, f"{t.name}: an agent")
            for n in range(2):
                replicated = [e for e in events(t.log(n)) if e.get("action") == "replicated"]
                if (mode == "on") != bool(replicated):
                    said = [e for e in events(t.log(n)) if "replica" in e.get("action", "")]
                    sys.exit(f"{t.name}: node {n} logged {len(replicated)} \"replicated\" actions with replication "
                             f"{mode}: {said}")
                if replicated:  # what one checkpoint sends, about (bytes_sent_total counts every pass)
                    sent_mb = replicated[-1]["bytes_sent_total"] / (replicated[-1]["step"] // every) / 1e6
            ms = train_gpt_step_ms(t.out(0), every) if gpt else step_ms(t.out(0))
            if not ms:
                sys.exit(f"{t.name}: no step times in {t.out(0)}")
            results[mode].append(statistics.median(ms))
    on, off = statistics.median(results["on"]), statistics.median(results["off"])
    mb = checkpoint_mb_per_rank(t.ckpt)
    what = "train_gpt (" + " ".join(TRAIN_GPT_MODEL) + ")" if gpt else "5 ms"
    print(f"2 nodes x 2 ranks, {mb:.1f} MB of checkpoint per rank on disk, a checkpoint every {every} steps of {what}; "
          f"replication sends about {sent_mb:.0f} MB per node and checkpoint")
    print(f"  replication off  {off:7.2f} ms/step (median of {args.trials} runs: "
          f"{', '.join(f'{v:.1f}' for v in results['off'])})")
    print(f"  replication on   {on:7.2f} ms/step ({', '.join(f'{v:.1f}' for v in results['on'])})")
    print(f"  overhead         {100 * (on / off - 1):+6.1f}%")


RECOVERY_KILL_AFTER = 30  # the step S node 1 is lost after (checkpoints every 10 steps)


def recovery_trial(args, endpoint, directory, way, i):
    """One replacement of a lost node 1, its state from peer memory or from disk (see the docstring)."""
    memory = way == "peer memory"
    t = Trial(args, endpoint, directory, f"recovery{'memory' if memory else 'disk'}{i}")
    flags = ["--config", replication_config(directory, memory, lease=True)]
    drill = ["--steps", "80", "--ckpt-every", "10", "--params", str(args.params), "--compute-ms", "20", "--quiet"]
    procs = [t.agent(n, flags, drill) for n in range(2)]

    def replicated():
        steps = [e["step"] for e in events(t.log(1)) if e.get("action") == "replicated"]
        return steps[-1] if steps and steps[-1] >= RECOVERY_KILL_AFTER else None

    def on_disk():
        steps = [s for s in committed_steps(t.ckpt) if s >= RECOVERY_KILL_AFTER]
        return max(steps) if steps else None

    if memory:
        wait_until(replicated, f"{t.name}: node 1 replicating a step from {RECOVERY_KILL_AFTER} on")
    else:
        wait_until(on_disk, f"{t.name}: a step from {RECOVERY_KILL_AFTER} on committed on disk")
    killed_at = t.kill(1, procs[1])
    if memory:  # the disk loses step S and everything after it
        lost_from = replicated()
        for step, name in committed_steps(t.ckpt).items():
            if step >= lost_from:
                shutil.rmtree(os.path.join(t.ckpt, name), ignore_errors=True)
    if not args.warm_disk:
        evict(t.ckpt)
    started_at = time.time()
    replacement = t.agent(2, flags, drill, node_rank=1)
    finish(procs[0], 300, f"{t.name}: node 0")
    finish(replacement, 300, f"{t.name}: the replacement")

    survivor, new = events(t.log(0)), events(t.log(2))
    lost = [e for e in survivor if e.get("kind") == "node_lost"]
    resumed = [e for e in survivor if e.get("action") == "resumed"]
    launch = [e for e in new if e.get("action") == "launch"]
    if not lost or lost[0]["ranks"] != [2, 3] or len(resumed) != 1 or len(launch) != 1:
        sys.exit(f"{t.name}: expected node_lost naming ranks 2,3, then one resume: {lost} {resumed} {launch}")
    source = resumed[0].get("source")
    if source != ("peer_memory" if memory else "disk"):
        sys.exit(f"{t.name}: resumed from {source}, expected {way}: {resumed[0]}")
    sent = [e for e in survivor if e.get("action") == "sent_resume_step"]
    fetched = [e for e in new if e.get("action") == "fetched_resume_step"]
    if memory and (len(sent) != 1 or len(fetched) != 1):
        sys.exit(f"{t.name}: expected one sent_resume_step on node 0 and one fetched_resume_step on the "
                 f"replacement: {sent} {fetched}")
    resumed_at = iso_seconds(resumed[0]["time"])
    return {"lost": iso_seconds(lost[0]["time"]) - killed_at,
            "launch": iso_seconds(launch[0]["time"]) - iso_seconds(lost[0]["time"]),
            "load": resumed_at - iso_seconds(launch[0]["time"]),
            "start": resumed_at - started_at,
            "total": resumed_at - killed_at,
            "step": resumed[0]["resumed_from_checkpoint"],
            "sent_mb": sent[0]["bytes"] / 1e6 if sent else None,
            "sent_s": sent[0]["seconds"] if sent else None,
            "fetched_s": fetched[0]["seconds"] if fetched else None}


def run_recovery(args, endpoint, directory):
    ways = ("peer memory", "disk")
    trials = {way: [] for way in ways}
    for i in range(args.trials):
        for way in ways:
            trials[way].append(recovery_trial(args, endpoint, directory, way, i))
    mb = checkpoint_mb_per_rank(Trial(args, endpoint, directory, "recoverydisk0").ckpt)
    print(f"a replacement for lost node 1 of 2 nodes x 2 ranks, {mb:.1f} MB of checkpoint per rank, lease 3 s; "
          f"median (max) of {args.trials} trials, seconds")
    columns = [("lost", "kill->node_lost"), ("launch", "node_lost->launch"), ("load", "launch->resumed"),
               ("start", "start->resumed"), ("total", "kill->resumed")]
    print(f"{'from':12}" + "".join(f"{title:>18}" for _, title in columns) + "  resumed steps  transfer")
    for way in ways:
        rows = trials[way]
        line = f"{way:12}"
        for key, _ in columns:
            values = [r[key] for r in rows]
            line += f"{statistics.median(values):>10.2f} ({max(values):5.2f})"
        line += f"  {','.join(str(r['step']) for r in rows):>13}"
        if rows[0]["sent_mb"] is not None:
            line += (f"  {statistics.median(r['sent_mb'] for r in rows):.0f} MB sent in "
                     f"{statistics.median(r['sent_s'] for r in rows):.2f} s, fetched (waited) in "
                     f"{statistics.median(r['fetched_s'] for r in rows):.2f} s")
        else:
            line += "  -"
        print(line, flush=True)


def run_faults(args, endpoint, directory):
    print(f"{'fault':6} {'trials':>6} {'detect median':>14} {'detect max':>11} {'resume median':>14} {'resume max':>11}")
    for fault in args.faults.split(","):
        detects, resumes = [], []
        for i in range(args.trials):
            d, r = run_fault(args, endpoint, directory, fault, i)
            detects.append(d)
            if r is not None:
                resumes.append(r)
        print(f"{fault:6} {args.trials:>6} {statistics.median(detects):>13.3f}s {max(detects):>10.3f}s "
              f"{statistics.median(resumes):>13.2f}s {max(resumes):>10.2f}s", flush=True)


def stop_started():
    """Stops the agents a failed trial left running: SIGTERM (each stops its ranks), then SIGKILL."""
    running = [p for p in STARTED if p.poll() is None]
    for p in running:
        os.killpg(p.pid, signal.SIGTERM)
    for p in running:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("agent")
    p.add_argument("drill")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--faults", default="crash,hang,lost")
    p.add_argument("--overhead", action="store_true", help="measure replication's cost to training instead")
    p.add_argument("--job", choices=("drill", "train_gpt"), default="drill", help="the job of --overhead")
    p.add_argument("--recovery", action="store_true",
                   help="measure a replacement node's recovery from peer memory and from disk instead")
    p.add_argument("--warm-disk", action="store_true",
                   help="(--recovery) leave the checkpoint files in the page cache after the kill")
    p.add_argument("--params", type=int, help="floats per rank (--overhead: default 4000000, --recovery: 16000000)")
    p.add_argument("--ckpt-every", type=int, default=None,
                   help="(--overhead; default 50 for the drill, 5 for train_gpt)")
    args = p.parse_args()
    if args.params is None:
        args.params = 16_000_000 if args.recovery else 4_000_000
    directory = tempfile.mkdtemp(prefix="lifeline-multinode-figures-")
    # The nodes' memory tiers, in shared memory like a node's (a tier on disk would time the disk).
    args.tiers = tempfile.mkdtemp(prefix="lifeline-multinode-figures-",
                                  dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    etcd, endpoint = start_etcd(directory)
    done = False
    try:
        if args.overhead:
            run_overhead(args, endpoint, directory)
        elif args.recovery:
            run_recovery(args, endpoint, directory)
        else:
            run_faults(args, endpoint, directory)
        done = True
    finally:
        stop_started()
        etcd.kill()
        etcd.wait()
        shutil.rmtree(args.tiers, ignore_errors=True)
        if done:
            shutil.rmtree(directory, ignore_errors=True)
        else:  # what a failure message points at
            print(f"kept the logs and checkpoints in {directory}", file=sys.stderr)

if __name__ == "__main__":
    main()
