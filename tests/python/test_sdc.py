"""Replicas that must be bit-identical, checked at every snapshot (issue 53, items 3 and 4).

A 3-rank gloo DDP job under lifeline-agent saves every 2 steps. Right after step 4's update, one
bit of rank 2's copy of one parameter is flipped in place (silent data corruption of one replica).

- With `policy.sdc_suspect: log`, the agent must name rank 2 at the step-4 snapshot (sdc_suspect,
  with the tensor and its byte range), mark step 4 suspect in the checkpoint (and the later steps,
  whose replicas still differ), and never resume from it: rank 1 is then killed, and the relaunch
  resumes from step 2. `lifeline ls` shows the suspect steps and `lifeline verify` fails on them.
- With the default policy (rollback), the same flip rolls the job back at once: the ranks are
  stopped, relaunched from step 2 (the newest checkpoint before the suspect step), the job
  finishes, and the rollback's record carries the evidence (rank, node, tensors).
- The flip on two launches in a row (the same machine corrupting again): the second sdc_suspect
  on the node ends this single-node job, naming the node and the rank.
- A clean run raises nothing, marks nothing, and its ranks did send their digests.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

SCRIPT = textwrap.dedent("""
    import json, os, signal, sys, time
    import torch, torch.distributed as dist
    import lifeline, lifeline.torch
    torch.set_num_threads(1)
    out, mode = sys.argv[1], sys.argv[2]
    ckdir = os.path.join(out, "ckpt")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ckpt = lifeline.Checkpointer(ckdir, memory_tier=True)
    start = lifeline.torch.load(ckpt, model, opt) or 0
    restart = int(os.environ.get("LIFELINE_RESTART", "0"))
    with open(os.path.join(out, f"loaded.{restart}.{rank}"), "w") as f:
        f.write(str(start))
    lifeline.guard_optimizer(opt, ckpt)
    # flip_log: the flip on the first launch, then rank 1 dies once the agent marked the suspect
    # steps; its relaunch does one step. flip: the flip on the first launch; flip_twice: on the
    # first two.
    flips = {"flip_log": 1, "flip": 1, "flip_twice": 2}.get(mode, 0)
    last = 8 if restart == 0 or mode != "flip_log" else start + 1
    for step in range(start + 1, last + 1):
        if mode == "flip_log" and restart == 0 and rank == 1 and step == 7:
            # Once the agent has marked the corrupted snapshots, a crash: the relaunch must not
            # resume from them.
            deadline = time.time() + 60
            while time.time() < deadline and not all(
                    os.path.exists(os.path.join(ckdir, "step-%020d" % s, "suspect.json")) for s in (4, 6)):
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(32, 16, generator=g)
        with lifeline.trace.step(step):
            loss = (model(x) - x[:, :1]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        if restart < flips and rank == 2 and step == 4:
            p = model.module[0].weight
            with torch.no_grad():
                p.data.view(torch.int32).view(-1)[37] ^= 1 << 9  # a mantissa bit: training goes on, silently
        if step % 2 == 0:
            ckpt.save(step, lifeline.torch.state_dict(model, opt))
        if restart == 0 and step >= 4:  # slower after the flip: a verdict across nodes takes seconds
            time.sleep(float(os.environ.get("SDC_STEP_SECONDS", "0")))
    ckpt.close()
    lifeline.trace.dump(os.path.join(out, f"ring.{restart}.{rank}.jsonl"), 4096)
    dist.destroy_process_group()
""")


def _bin(name):
    return os.path.join(os.environ["LIFELINE_BIN"], name)


def _lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class ReplicaDigestsUnderTheAgent(unittest.TestCase):
    def setUp(self):
        base = os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp")
        self.dir = tempfile.mkdtemp(prefix="lifeline-sdc-", dir=base)
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.ckpt = os.path.join(self.dir, "ckpt")

    def run_job(self, mode, config=None, returncode=0, max_restarts=1):
        script = os.path.join(self.dir, "rank.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        events = os.path.join(self.dir, "events.jsonl")
        extra = []
        if config:
            path = os.path.join(self.dir, "agent.yaml")
            with open(path, "w") as f:
                f.write(config)
            extra = ["--config", path]
        r = subprocess.run([_bin("lifeline-agent"), "run", "--nproc", "3", "--master-port", "0", "--events-log", events,
                            "--checkpoint-dir", self.ckpt, "--max-restarts", str(max_restarts), "--node-name", "node-x",
                            *extra, "--", sys.executable, script, self.dir, mode],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, returncode, r.stdout + r.stderr)
        return _lines(events), r

    def cli(self, *args):
        return subprocess.run([_bin("lifeline"), *args], capture_output=True, text=True, timeout=60)

    def test_a_flipped_bit_names_its_rank_and_the_step_is_never_resumed_from(self):
        log, r = self.run_job("flip_log", config="policy:\n  sdc_suspect: log\n")
        sdc = [e for e in log if e.get("kind") == "sdc_suspect"]
        self.assertTrue(sdc, r.stderr)
        first = sdc[0]
        self.assertEqual(first["step"], 4, first)
        self.assertEqual(first["ranks"], [2], first)
        tensors = first["evidence"]["tensors"]
        self.assertEqual(len(tensors), 1, first)  # the parameter; its momentum was taken before the flip
        self.assertIn("0.weight", tensors[0]["tensor"])
        self.assertEqual(tensors[0]["byte_range"], [0, 32 * 16 * 4])
        self.assertEqual(tensors[0]["range_of"], "tensor")
        self.assertEqual(sorted(tensors[0]["digests"]), ["0", "1", "2"])
        self.assertTrue(first["evidence"]["majority"])
        self.assertIn("rank 2 holds a copy of", first["message"])
        self.assertIn("sdc_suspect (ranks 2)", r.stderr)
        # Every later snapshot of the diverged replica is suspect too; nothing before step 4.
        self.assertEqual(sorted({e["step"] for e in sdc}), [4, 6], sdc)
        marked = [e for e in log if e.get("action") == "mark_suspect"]
        self.assertTrue(all(e["ok"] for e in marked), marked)
        with open(os.path.join(self.ckpt, "step-%020d" % 4, "suspect.json")) as f:
            marker = json.load(f)
        self.assertEqual(marker["format"], "lifeline-suspect-1")
        self.assertEqual(marker["ranks"], [2])

        # Rank 1 was killed at step 7: the relaunch resumed from step 2, not from 6 or 4.
        self.assertTrue([e for e in log if e.get("kind") == "dead"], r.stderr)
        launches = [e for e in log if e.get("action") == "launch"]
        self.assertEqual(len(launches), 2, log)
        self.assertEqual(launches[1]["resume"]["step"], 2, launches[1])
        for rank in range(3):
            with open(os.path.join(self.dir, f"loaded.1.{rank}")) as f:
                self.assertEqual(f.read(), "2")

        ls = self.cli("ls", self.ckpt, "--json")
        self.assertEqual(ls.returncode, 0, ls.stderr)
        states = {(c["step"], c["location"]): c["state"] for c in json.loads(ls.stdout)["checkpoints"]}
        self.assertEqual(states[(4, "disk")], "suspect", states)
        self.assertEqual(states[(6, "disk")], "suspect", states)
        self.assertEqual(states[(2, "disk")], "complete", states)
        text = self.cli("ls", self.ckpt)
        self.assertIn("suspect", text.stdout)
        self.assertIn("rank 2", text.stdout)
        verify = self.cli("verify", self.ckpt, "--step", "4")
        self.assertEqual(verify.returncode, 1, verify.stdout + verify.stderr)
        self.assertIn("marked suspect", verify.stderr)
        self.assertEqual(self.cli("verify", self.ckpt, "--step", "2").returncode, 0)

    def test_a_flipped_bit_rolls_the_job_back_before_the_suspect_step_and_it_finishes(self):
        log, r = self.run_job("flip")
        sdc = [e for e in log if e.get("kind") == "sdc_suspect"]
        self.assertTrue(sdc, r.stderr)
        self.assertEqual((sdc[0]["step"], sdc[0]["ranks"], sdc[0]["policy"]), (4, [2], "rollback"), sdc[0])
        rollbacks = [e for e in log if e.get("action") == "rollback"]
        self.assertEqual(len(rollbacks), 1, log)
        rb = rollbacks[0]
        # The decision with its evidence: the rank, its node, the tensor and byte range that differ.
        self.assertEqual((rb["anomaly"], rb["anomaly_step"], rb["checkpoint"]), ("sdc_suspect", 4, 2), rb)
        self.assertEqual(rb["ranks"], [2])
        self.assertEqual(rb["nodes"], ["node-x"])
        self.assertEqual(rb["sdc_on_node"], 1)
        self.assertIn("0.weight", rb["evidence"]["tensors"][0]["tensor"])
        self.assertEqual(rb["evidence"]["tensors"][0]["byte_range"], [0, 32 * 16 * 4])
        self.assertIsNone(rb["skipped"])  # the data was sound: trained again
        # The suspect step (and any later one) went with the rollback: the relaunch saves them again.
        self.assertIn(4, rb["removed"])
        launches = [e for e in log if e.get("action") == "launch"]
        self.assertEqual(len(launches), 2, log)
        self.assertEqual(launches[1]["resume"]["step"], 2, launches[1])
        self.assertTrue(launches[1]["resume"]["rollback"])
        self.assertNotIn("skip_steps", launches[1]["resume"])
        for rank in range(3):
            with open(os.path.join(self.dir, f"loaded.1.{rank}")) as f:
                self.assertEqual(f.read(), "2")
        self.assertTrue([e for e in log if e.get("action") == "finished"], r.stderr)
        # The relaunch, with no flip, saved sound replicas: nothing is suspect now.
        for step in (2, 4, 6, 8):
            self.assertTrue(os.path.isdir(os.path.join(self.ckpt, "step-%020d" % step)), step)
            self.assertFalse(os.path.exists(os.path.join(self.ckpt, "step-%020d" % step, "suspect.json")), step)
        # Only the first launch's replicas differed: step 4, and step 6 when its snapshot was judged
        # before the ranks were stopped.
        self.assertEqual({e["restart"] for e in sdc}, {0}, sdc)
        self.assertTrue({e["step"] for e in sdc} <= {4, 6}, sdc)

    def test_a_second_flip_on_the_same_node_ends_a_single_node_job_naming_the_node_and_rank(self):
        log, r = self.run_job("flip_twice", returncode=1, max_restarts=3)
        sdc = [e for e in log if e.get("kind") == "sdc_suspect"]
        # Each launch's first one is step 4 (step 6's snapshot may be judged too before the stop).
        self.assertEqual([e["step"] for e in sdc if e["restart"] == 0][0], 4, sdc)
        self.assertEqual([e["step"] for e in sdc if e["restart"] == 1][0], 4, sdc)
        self.assertTrue(all(e["ranks"] == [2] for e in sdc), sdc)
        self.assertEqual([e["action"] for e in log if e.get("anomaly") == "sdc_suspect"], ["rollback", "rollback_give_up"])
        last = [e for e in log if e.get("action") == "rollback_give_up"][0]
        self.assertEqual((last["node_out"], last["sdc_on_node"], last["ranks"]), ("node-x", 2, [2]), last)
        self.assertIn("node node-x (rank 2)", last["reason"])
        self.assertIn("a single-node job cannot leave it out", last["reason"])
        give_up = [e for e in log if e.get("action") == "give_up"]
        self.assertTrue(give_up and "node node-x (rank 2)" in give_up[-1]["reason"], log)
        self.assertFalse(give_up[-1]["requeue_may_help"])
        self.assertIn("node node-x (rank 2)", r.stderr)
        self.assertEqual(len([e for e in log if e.get("action") == "launch"]), 2, log)

    def test_a_clean_run_raises_nothing_and_marks_nothing(self):
        log, r = self.run_job("clean")
        self.assertEqual([e for e in log if "kind" in e], [], r.stderr)
        for step in (2, 4, 6, 8):
            self.assertFalse(os.path.exists(os.path.join(self.ckpt, "step-%020d" % step, "suspect.json")))
        # The comparison ran: every rank sent a digest of each replicated tensor at every save.
        for rank in range(3):
            events = _lines(os.path.join(self.dir, f"ring.0.{rank}.jsonl"))
            digests = [e for e in events if e["type"] == "replica_digest"]
            self.assertEqual(sorted({e["step"] for e in digests}), [2, 4, 6, 8])
            self.assertEqual(len(digests), 4 * 8, digests)  # 4 parameters + 4 momentum buffers
            self.assertTrue(all(e["replicas"] == 3 for e in digests))


if __name__ == "__main__":
    unittest.main()
