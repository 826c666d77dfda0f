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
(--params floats per rank, a checkpoint every --ckpt-every steps) with replication on and off,
TRIALS times each, alternately, and prints the median ms/step of each and their ratio.
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


class Trial:
    def __init__(self, args, endpoint, directory, name):
        self.args, self.endpoint, self.dir, self.name = args, endpoint, directory, name

    def agent(self, node, agent_flags, drill_flags, nnodes="2"):
        ckpt = os.path.join(self.dir, self.name + ".ckpt")
        cmd = [self.args.agent, "run", "--nnodes", nnodes, "--nproc-per-node", "2", "--rdzv-endpoint",
               self.endpoint, "--rdzv-id", self.name, "--node-rank", str(node), "--hang-timeout", "5",
               "--max-restarts", "2", "--events-log", self.log(node), "--checkpoint-dir", ckpt] + agent_flags + \
              ["--", self.args.drill, "--dir", ckpt] + drill_flags
        env = dict(os.environ, LIFELINE_MEMORY_TIER_DIR=os.path.join(self.dir, f"{self.name}.tier{node}"))
        out = open(os.path.join(self.dir, f"{self.name}.{node}.out"), "w")
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def log(self, node):
        return os.path.join(self.dir, f"{self.name}.{node}.events")


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
            if p.wait(timeout=300) != 0:
                sys.exit(f"{t.name}: an agent exited {p.returncode}; see {directory}")
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
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # past a checkpoint, so that the survivor resumes from one
        with open(os.path.join(directory, f"{t.name}.1.out")) as f:
            if "checkpoint step=100" in f.read():
                break
        time.sleep(0.05)
    os.killpg(procs[1].pid, signal.SIGKILL)  # the agent's group
    for e in events(t.log(1)):
        if e.get("action") == "launch":
            for pid in e["pids"]:
                try:
                    os.killpg(pid, signal.SIGKILL)  # each rank leads its own group
                except ProcessLookupError:
                    pass
    killed_at = time.time()
    procs[1].wait()
    if procs[0].wait(timeout=300) != 0:
        sys.exit(f"{t.name}: node 0 exited {procs[0].returncode}; see {directory}")
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


def run_overhead(args, endpoint, directory):
    drill = ["--steps", "1000", "--ckpt-every", str(args.ckpt_every), "--params", str(args.params),
             "--compute-ms", "5"]
    results = {"on": [], "off": []}
    for i in range(args.trials):
        for mode in ("on", "off"):
            config = os.path.join(directory, f"replication-{mode}.yaml")
            with open(config, "w") as f:
                f.write(f"replication:\n  enabled: {'true' if mode == 'on' else 'false'}\n")
            t = Trial(args, endpoint, directory, f"over{mode}{i}")
            procs = [t.agent(n, ["--config", config], drill) for n in range(2)]
            for p in procs:
                if p.wait(timeout=600) != 0:
                    sys.exit(f"{t.name}: an agent exited {p.returncode}; see {directory}")
            ms = step_ms(os.path.join(directory, f"{t.name}.0.out"))
            replicated = [e for e in events(t.log(0)) if e.get("action") == "replicated"]
            if mode == "on" and not replicated:
                sys.exit(f"{t.name}: nothing was replicated")
            results[mode].append(statistics.median(ms))
    on, off = statistics.median(results["on"]), statistics.median(results["off"])
    mb = args.params * 4 * 2 / 1e6
    print(f"2 nodes x 2 ranks, {mb:.0f} MB of state per rank, a checkpoint every {args.ckpt_every} steps of 5 ms")
    print(f"  replication off  {off:7.2f} ms/step (median of {args.trials} runs)")
    print(f"  replication on   {on:7.2f} ms/step")
    print(f"  overhead         {100 * (on / off - 1):+6.1f}%")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("agent")
    p.add_argument("drill")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--faults", default="crash,hang,lost")
    p.add_argument("--overhead", action="store_true", help="measure replication's cost to training instead")
    p.add_argument("--params", type=int, default=4_000_000, help="floats per rank (--overhead)")
    p.add_argument("--ckpt-every", type=int, default=50, help="(--overhead)")
    args = p.parse_args()
    directory = tempfile.mkdtemp(prefix="lifeline-multinode-figures-")
    etcd, endpoint = start_etcd(directory)
    try:
        if args.overhead:
            run_overhead(args, endpoint, directory)
            return
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
    finally:
        etcd.kill()
        etcd.wait()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
