"""Python ranks under lifeline-agent: their trace events name the hung rank, and they resume.

Two ranks all-reduce over gloo inside lifeline.trace scopes and checkpoint every 5 steps. In the
first launch rank 1 stops before its all-reduce of step 13 (rank 0 waits inside it). The agent must
report a hang naming rank 1 in that all-reduce, restart both ranks, and see them resume from step 10
(loaded through ckpt.load, which tells the agent); the job then finishes and the agent exits 0.
"""

import json
import os
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


if __name__ == "__main__":
    unittest.main()
