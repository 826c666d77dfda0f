"""Python ranks under lifeline-agent: their trace events name the hung rank, and they resume; a
second job in a checkpoint directory is refused, and a job that lost its final checkpoint fails.

Two ranks all-reduce over gloo inside lifeline.trace scopes and checkpoint every 5 steps. In the
first launch rank 1 stops before its all-reduce of step 13 (rank 0 waits inside it). The agent must
report a hang naming rank 1 in that all-reduce, restart both ranks, and see them resume from step 10
(loaded through ckpt.load, which tells the agent); the job then finishes and the agent exits 0.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

RANK_SCRIPT = textwrap.dedent("""
    import os, sys, time
    import torch, torch.distributed as dist
    import lifeline
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    w = torch.zeros(1000)
    state = {"w": lifeline.Shard(w, replica=(rank, world)), "note": "x"}
    ckpt = lifeline.Checkpointer(sys.argv[1], rank=rank, world_size=world, memory_tier=True)
    start = ckpt.load(state) or 0
    restart = int(os.environ.get("LIFELINE_RESTART", "0"))
    for step in range(start + 1, 31):
        with lifeline.trace.step(step):
            g = torch.full((1000,), float(step))
            if step == 13 and rank == 1 and restart == 0:
                time.sleep(3600)  # hung before the collective: rank 0 waits inside it
            with lifeline.trace.collective("allreduce", g.numel() * 4):
                dist.all_reduce(g)
            ckpt.wait_snapshot()
            w.add_(g)
            if step % 5 == 0:
                ckpt.save(step, state)
    ckpt.close()
    lifeline.trace.process_exit()
    dist.destroy_process_group()
    if rank == 0:
        print("final", w[0].item())
""")


class AgentSupervisesPython(unittest.TestCase):
    def setUp(self):
        base = os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp")
        self.dir = tempfile.mkdtemp(prefix="lifeline-pyagent-", dir=base)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_hang_named_and_resumed(self):
        agent = os.path.join(os.environ["LIFELINE_BIN"], "lifeline-agent")
        script = os.path.join(self.dir, "rank.py")
        with open(script, "w") as f:
            f.write(RANK_SCRIPT)
        events = os.path.join(self.dir, "events.jsonl")
        r = subprocess.run([agent, "run", "--nproc", "2", "--master-port", "0", "--hang-timeout", "2",
                            "--max-restarts", "1", "--events-log", events, "--",
                            sys.executable, script, os.path.join(self.dir, "ckpt")],
                           capture_output=True, text=True, timeout=240)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(events) as f:
            lines = [json.loads(l) for l in f if l.strip()]
        hangs = [e for e in lines if e.get("kind") == "hang"]
        self.assertEqual(len(hangs), 1, lines)
        self.assertEqual(hangs[0]["ranks"], [1])
        self.assertEqual(hangs[0]["step"], 13)
        self.assertEqual(hangs[0].get("op"), "allreduce")
        self.assertEqual(hangs[0]["evidence"]["waiting_ranks"], [0])
        resumed = [e for e in lines if e.get("action") == "resumed"]
        self.assertEqual(len(resumed), 1, lines)
        self.assertEqual(resumed[0]["resumed_from_checkpoint"], 10)
        self.assertFalse([e for e in lines if e.get("kind") not in (None, "hang")], lines)
        # Sum over steps 1..30 of 2*step, whatever the interruption.
        self.assertIn("[rank 0] final 930.0", r.stdout)
        # Before killing it, the agent asked the hung rank for its last events and its Python
        # stack; both are kept after the agent ends (issue 32, item 14).
        kept = re.search(r"dumps \(ring events, Python stacks\) are kept in (\S+)", r.stderr)
        self.assertIsNotNone(kept, r.stderr)
        self.addCleanup(shutil.rmtree, kept.group(1), True)
        names = os.listdir(kept.group(1))
        stacks = [n for n in names if n.startswith("stack.1.")]
        self.assertEqual(len(stacks), 1, names)
        with open(os.path.join(kept.group(1), stacks[0])) as f:
            stack = f.read()
        self.assertIn("rank.py", stack)
        self.assertIn("line 17", stack)  # time.sleep(3600), where rank 1 hung
        self.assertTrue([n for n in names if n.startswith("dump.1.")], names)


HOLDER_SCRIPT = textwrap.dedent("""
    import sys, torch, lifeline
    c = lifeline.Checkpointer(sys.argv[1], rank=0, world_size=1, run_id="first-job")
    c.save(1, {"w": torch.ones(64)}).wait()
    print("ready", flush=True)
    sys.stdin.read()  # holds the directory until the test closes stdin or kills it
""")

# Saves without waiting on its tickets, and never closes: only the agent can tell its saves failed.
UNCHECKED_SAVER = textwrap.dedent("""
    import sys, torch, lifeline
    c = lifeline.Checkpointer(sys.argv[1])
    for step in (2, 3):
        c.save(step, {"w": torch.full((64,), float(step))})
    c.wait_snapshot()
""")


class TwoJobsInOneDirectory(unittest.TestCase):
    """Issue 32, item 4: a second job in a directory lost its final checkpoint and exited 0."""

    def setUp(self):
        base = os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp")
        self.dir = tempfile.mkdtemp(prefix="lifeline-twojobs-", dir=base)
        self.ckpt = os.path.join(self.dir, "ckpt")
        self.bin = os.environ["LIFELINE_BIN"]
        env = dict(os.environ)
        env.pop("LIFELINE_LAUNCH_ID", None)
        self.holder = subprocess.Popen([sys.executable, "-c", HOLDER_SCRIPT, self.ckpt], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True, env=env)
        self.assertEqual(self.holder.stdout.readline().strip(), "ready")

    def tearDown(self):
        self.holder.kill()
        self.holder.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def script(self, text):
        path = os.path.join(self.dir, "job.py")
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_the_agent_refuses_a_checkpoint_dir_another_job_saves_into(self):
        r = subprocess.run([os.path.join(self.bin, "lifeline-agent"), "run", "--nproc", "1", "--master-port", "0",
                            "--checkpoint-dir", self.ckpt, "--", sys.executable, self.script(UNCHECKED_SAVER),
                            self.ckpt], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("is being saved into by another job, launch 'first-job' (pid %d" % self.holder.pid, r.stderr)
        self.assertNotIn("[rank 0]", r.stdout)  # refused before any rank started

    def test_a_job_whose_last_checkpoint_failed_does_not_exit_0(self):
        r = subprocess.run([os.path.join(self.bin, "lifeline-agent"), "run", "--nproc", "1", "--master-port", "0",
                            "--max-restarts", "0", "--", sys.executable, self.script(UNCHECKED_SAVER), self.ckpt],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("every rank ended with status 0, but the last checkpoint of ranks 0 failed (step 3: "
                      "FailedPrecondition", r.stderr)

    def test_close_raises_when_the_last_save_failed(self):
        code = ("import sys, torch, lifeline\n"
                "c = lifeline.Checkpointer(sys.argv[1], rank=0, world_size=1, run_id='second-job')\n"
                "c.save(5, {'w': torch.zeros(64)})\n"
                "c.close()\n")
        r = subprocess.run([sys.executable, "-c", code, self.ckpt], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("the last checkpoint (step 5) was not saved", r.stderr)
        self.assertIn("launch 'first-job'", r.stderr)

    def test_gc_of_partial_steps_waits_for_the_job_and_ls_names_it(self):
        cli = os.path.join(self.bin, "lifeline")
        r = subprocess.run([cli, "ls", self.ckpt], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("saving now: launch 'first-job' (pid %d" % self.holder.pid, r.stdout)
        os.makedirs(os.path.join(self.ckpt, "step-00000000000000000009"))  # a save in progress, as gc sees it
        r = subprocess.run([cli, "gc", self.ckpt, "--keep", "1", "--partial"], capture_output=True, text=True,
                           timeout=60)
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn("launch 'first-job'", r.stderr + r.stdout)
        self.assertTrue(os.path.isdir(os.path.join(self.ckpt, "step-00000000000000000009")))
        self.holder.stdin.close()  # the job ends: gc may go on
        self.assertEqual(self.holder.wait(timeout=60), 0)
        r = subprocess.run([cli, "gc", self.ckpt, "--keep", "1", "--partial"], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertFalse(os.path.isdir(os.path.join(self.ckpt, "step-00000000000000000009")))


RESUMING_SCRIPT = textwrap.dedent("""
    import os, sys, torch, lifeline
    c = lifeline.Checkpointer(sys.argv[1], memory_tier=True)
    w = {"w": torch.zeros(8)}
    start = c.load(w) or 0
    for step in range(start + 1, 8):
        with lifeline.trace.step(step):
            if step == 7 and os.environ.get("LIFELINE_RESTART") == "0" and sys.argv[2] == "crash":
                os._exit(1)  # a crash: the memory tier keeps step 5
            w["w"] += 1
            if step % 5 == 0:
                c.save(step, w).wait()
    c.close()
""")


class ResumeIsSaidTruly(unittest.TestCase):
    """Issue 32, item 14: the events log said "source": "disk" for ranks that loaded from memory, and
    a script whose checkpoint path was mistyped started from scratch without a word."""

    def setUp(self):
        base = os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp")
        self.dir = tempfile.mkdtemp(prefix="lifeline-resume-words-", dir=base)
        self.script = os.path.join(self.dir, "job.py")
        with open(self.script, "w") as f:
            f.write(RESUMING_SCRIPT)
        self.env = dict(os.environ, LIFELINE_MEMORY_TIER_DIR=os.path.join(self.dir, "shm"))

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def run_agent(self, name, script_dir, mode):
        events = os.path.join(self.dir, name + ".jsonl")
        r = subprocess.run([os.path.join(os.environ["LIFELINE_BIN"], "lifeline-agent"), "run", "--nproc", "1",
                            "--master-port", "0", "--max-restarts", "1", "--checkpoint-dir",
                            os.path.join(self.dir, "ckpt"), "--events-log", events, "--", sys.executable, self.script,
                            script_dir, mode], capture_output=True, text=True, timeout=240, env=self.env)
        with open(events) as f:
            return r, [json.loads(l) for l in f if l.strip()]

    def test_the_source_is_where_the_ranks_loaded_from_and_a_wrong_path_is_said(self):
        r, lines = self.run_agent("crash", os.path.join(self.dir, "ckpt"), "crash")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        resumed = [e for e in lines if e.get("action") == "resumed"]
        self.assertEqual(len(resumed), 1, lines)
        self.assertEqual(resumed[0]["resumed_from_checkpoint"], 5)
        # Disk and memory both hold step 5; the Checkpointer reads memory first, and the log says so.
        self.assertEqual(resumed[0]["source"], "memory", resumed[0])

        r, lines = self.run_agent("typo", os.path.join(self.dir, "ckpt-typo"), "clean")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        said = [e for e in lines if e.get("action") == "resume_mismatch"]
        self.assertEqual(len(said), 1, lines)
        self.assertEqual(said[0]["expected_step"], 5, said[0])
        self.assertIn("ckpt-typo", said[0]["opened_directory"])
        self.assertIn("is the script's checkpoint path right?", r.stderr)


if __name__ == "__main__":
    unittest.main()
