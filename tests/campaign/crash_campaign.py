#!/usr/bin/env python3
"""A real-SIGKILL crash campaign against saving ranks under lifeline-agent.

    crash_campaign.py AGENT DRILL LIFELINE [--kills N] [--seed S] [--keep DIR]

Runs lifeline-drill (a deterministic data-parallel job that checkpoints every step) under
lifeline-agent twice, with the memory tier and without it. While it trains, random ranks are
SIGKILLed at random moments (most of them inside a save); the agent relaunches the job each time.
For every kill it checks the invariants a user relies on:
  - every rank of the relaunch resumes from the same step;
  - that step is never older than the newest step that was complete (on disk or in memory) when
    the rank was killed: no commit is lost;
and at the end: the final model equals a clean run's bit for bit, the newest checkpoint verifies
(`lifeline verify`), and no step is left invalid or damaged (`lifeline ls`).
Prints one summary line; exits non-zero naming the first violated invariant. The seed is printed
so that a failure can be replayed.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

STEPS = 300              # set in main from the number of kills: the job must outlast them
PARAMS = 1 << 20          # floats per rank: 4 MiB of state, so a save takes a few ms
COMPUTE_MS = 15


def drill_args(drill, ckpt, memory_tier):
    args = [drill, "--dir", ckpt, "--steps", str(STEPS), "--ckpt-every", "1", "--params", str(PARAMS),
            "--compute-ms", str(COMPUTE_MS), "--seed", "7", "--quiet"]
    return args if memory_tier else args + ["--no-memory-tier"]


def agent_config(path, max_restarts):
    with open(path, "w") as f:
        f.write("restart:\n  max_restarts: %d\n  grace_seconds: 2\n  backoff_initial_seconds: 0.05\n"
                "  backoff_max_seconds: 0.1\n" % max_restarts)


class AgentRun:
    """lifeline-agent running the drill, its output lines collected with their arrival times."""

    def __init__(self, agent, drill, work, memory_tier, nproc, max_restarts):
        self.ckpt = os.path.join(work, "ckpt")
        self.events = os.path.join(work, "events.jsonl")
        config = os.path.join(work, "agent.yaml")
        agent_config(config, max_restarts)
        cmd = [agent, "run", "--nproc", str(nproc), "--config", config, "--master-port", "0",
               "--hang-timeout", "30", "--events-log", self.events, "--checkpoint-dir", self.ckpt, "--"]
        cmd += drill_args(drill, self.ckpt, memory_tier)
        self.lines = []
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self.lock:
                self.lines.append((time.monotonic(), line.rstrip("\n")))

    def output(self):
        with self.lock:
            return [l for _, l in self.lines]

    def event_lines(self):
        try:
            with open(self.events) as f:
                return [json.loads(l) for l in f if l.strip()]
        except FileNotFoundError:
            return []

    def launches(self):
        return [e for e in self.event_lines() if e.get("action") == "launch"]

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            return None


def newest_complete(lifeline, ckpt):
    """The newest step `lifeline ls` calls complete, on disk or in the memory tier, or -1."""
    r = subprocess.run([lifeline, "ls", ckpt, "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        return -1, []
    rows = json.loads(r.stdout)["checkpoints"]
    steps = [c["step"] for c in rows if c["state"] == "complete"]
    return (max(steps) if steps else -1), rows


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def finals(lines):
    out = {}
    for l in lines:
        m = re.search(r"final rank=(\d+) step=(\d+) checksum=([0-9a-f]+)", l)
        if m:
            out[int(m.group(1))] = (int(m.group(2)), m.group(3))
    return out


def resumes(lines):
    """Per launch, in order: {rank: step or None}, from the drill's resume lines."""
    launches, current = [], {}
    for l in lines:
        m = re.search(r"\brank (\d+) (?:resumed from step (\d+)|starting fresh)", l)
        if not m:
            continue
        rank = int(m.group(1))
        if rank in current:
            launches.append(current)
            current = {}
        current[rank] = int(m.group(2)) if m.group(2) else None
    if current:
        launches.append(current)
    return launches


def fail(message, run=None):
    print("crash campaign FAILED: " + message)
    if run is not None:
        print("--- last output ---")
        for l in run.output()[-40:]:
            print(l)
    sys.exit(1)


def campaign(args, rng, memory_tier, kills, reference):
    work = tempfile.mkdtemp(prefix="lifeline-campaign-")
    run = AgentRun(args.agent, args.drill, work, memory_tier, args.nproc, kills + 5)
    tier = "memory tier" if memory_tier else "disk only"
    floors = []  # (launch index killed, newest complete step at the kill)
    done = 0
    deadline = time.monotonic() + 150
    while done < kills and time.monotonic() < deadline:
        if run.proc.poll() is not None:
            fail(f"{tier}: the job ended after {done} of {kills} kills", run)
        launches = run.launches()
        if len(launches) != done + 1:
            time.sleep(0.02)
            continue
        # Not before every rank of this launch said where it resumed from: a kill during start-up
        # tests the launcher, not the checkpoint, and on a loaded machine start-up alone can outlast
        # the random delay below (a rank killed before its resume line also spoils the count of
        # resumed launches checked at the end).
        started = resumes(run.output())
        if len(started) != done + 1 or len(started[-1]) != args.nproc:
            time.sleep(0.02)
            continue
        # Let the relaunched job train into its first saves, then kill at a random moment.
        time.sleep(rng.uniform(0.25, 0.9))
        pids = [p for p in launches[-1]["pids"] if alive(p)]
        if not pids:
            continue
        victim = rng.choice(pids)
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            continue
        floor, _ = newest_complete(args.lifeline, run.ckpt)
        floors.append((done + 1, floor))
        done += 1
    if done < kills:
        fail(f"{tier}: only {done} of {kills} kills in the time allowed", run)
    rc = run.wait(240)
    lines = run.output()
    if rc != 0:
        fail(f"{tier}: lifeline-agent exited {rc}", run)
    per_launch = resumes(lines)
    if len(per_launch) != kills + 1:
        fail(f"{tier}: {len(per_launch)} launches resumed, expected {kills + 1}", run)
    for i, launch in enumerate(per_launch):
        if len(launch) != args.nproc or len(set(launch.values())) != 1:
            fail(f"{tier}: launch {i} resumed its ranks from different steps: {launch}", run)
    # The agent fixed each launch's resume step before starting it; the ranks must have loaded it.
    fixed = [e.get("resume") for e in run.launches()]
    for i, (launch, resume) in enumerate(zip(per_launch, fixed)):
        step = next(iter(launch.values()))
        if resume is None or resume.get("step") != step:
            fail(f"{tier}: launch {i} resumed from step {step}, the agent fixed {resume}", run)
    for launch_index, floor in floors:
        step = next(iter(per_launch[launch_index].values()))
        if floor >= 0 and (step is None or step < floor):
            fail(f"{tier}: launch {launch_index} resumed from step {step}, older than step {floor} "
                 f"which was complete when its predecessor was killed", run)
    got = finals(lines)
    if got != reference:
        fail(f"{tier}: final state {got} differs from a clean run's {reference}", run)
    v = subprocess.run([args.lifeline, "verify", run.ckpt], capture_output=True, text=True)
    if v.returncode != 0:
        fail(f"{tier}: lifeline verify failed: {v.stdout}{v.stderr}", run)
    _, rows = newest_complete(args.lifeline, run.ckpt)
    bad = [c for c in rows if c["state"] in ("invalid", "damaged")]
    if bad:
        fail(f"{tier}: steps left invalid or damaged: {bad}", run)
    resumed_from = [next(iter(l.values())) for l in per_launch[1:]]
    sources = [e.get("resume", {}).get("location") for e in run.launches()[1:] if e.get("resume")]
    if args.keep:
        shutil.copytree(work, os.path.join(args.keep, "memory" if memory_tier else "disk"), dirs_exist_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    return resumed_from, sources


def main():
    p = argparse.ArgumentParser()
    p.add_argument("agent")
    p.add_argument("drill")
    p.add_argument("lifeline")
    p.add_argument("--kills", type=int, default=24, help="kills in all, half with the memory tier")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--keep", default=None, help="copy each run's directory here")
    args = p.parse_args()
    global STEPS
    STEPS = 100 + 60 * ((args.kills + 1) // 2)  # about 30 steps pass between two kills
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    print(f"crash campaign: seed {seed} (replay with --seed {seed}), {args.kills} kills, {args.nproc} ranks",
          flush=True)
    rng = random.Random(seed)
    started = time.monotonic()

    # The reference: the same job without faults.
    work = tempfile.mkdtemp(prefix="lifeline-campaign-ref-")
    ref = AgentRun(args.agent, args.drill, work, True, args.nproc, 0)
    if ref.wait(240) != 0:
        fail("the clean reference run failed", ref)
    reference = finals(ref.output())
    shutil.rmtree(work, ignore_errors=True)
    if len(reference) != args.nproc:
        fail(f"the clean run printed no final state for every rank: {reference}", ref)

    first = args.kills // 2
    tier_steps, tier_sources = campaign(args, rng, True, first, reference)
    disk_steps, _ = campaign(args, rng, False, args.kills - first, reference)
    print(f"crash campaign: {args.kills} SIGKILLs survived ({first} with the memory tier, "
          f"{args.kills - first} disk only), every relaunch on one step, no commit lost, final state equal to "
          f"a clean run, newest checkpoint verified; resumed from memory {tier_sources.count('memory')} times; "
          f"seed {seed}; {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
