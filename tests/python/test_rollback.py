"""Rollback (issue 53, item 4): a NaN or a loss spike rolls the job back to the checkpoint before it.

A 2-rank gloo DDP job under lifeline-agent checkpoints every 5 steps with lifeline.torch; its data
at a step is a function of the step alone (as a resumable data loader's is). Faults:

- a NaN loss on rank 1 at step 25, on the first launch only: the agent rolls back to step 20 (the
  checkpoints of step 25 and later may hold the NaN and are removed), the relaunch trains 21..39
  again and the job ends with the very parameters of a run without the fault;
- a spike, the loss x50 at steps 25-27 on every launch (bad data): the first rollback replays the
  same data (rollback.skip_data: on_repeat), the spike comes back, the second rollback tells the
  ranks to skip the steps it rolls back, 21 to the newest reached (LIFELINE_SKIP_STEPS,
  lifeline.skip_steps(), the load's skip_steps), and the job finishes without them;
- the same spike with rollback.skip_data: never: after 2 rollbacks to step 20 the agent gives up
  saying the data or the model is at fault.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

SCRIPT = textwrap.dedent("""
    import hashlib, json, os, sys, time
    import torch, torch.distributed as dist
    import lifeline, lifeline.torch
    torch.set_num_threads(1)
    out, fault = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    restart = int(os.environ.get("LIFELINE_RESTART", "0"))
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ckpt = lifeline.Checkpointer(os.path.join(out, "ckpt"), memory_tier=True)
    lifeline.guard_optimizer(opt, ckpt)
    loaded = lifeline.torch.load(ckpt, model, opt)
    start = 0 if loaded is None else int(loaded) + 1
    skip = lifeline.skip_steps()
    skipped = []
    for step in range(start, 40):
        # The batch of a step depends on the step alone: a resumed launch sees the same data.
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(256, 16, generator=g)
        if step in skip:  # the recipe: the step's batch is drawn, and not trained on
            skipped.append(step)
            continue
        with lifeline.trace.step(step):
            loss = (model(x) - x[:, :1]).pow(2).mean()
            if fault == "nan" and rank == 1 and step == 25 and restart == 0:
                loss = loss * float("nan")  # a poisoned batch on rank 1, on the first launch only
            if fault == "spike" and 25 <= step <= 27:
                loss = loss * 50  # bad data at these steps, on every launch
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e6)
            opt.step()
            lifeline.report(loss=loss)
        if step % 5 == 0:
            ckpt.save(step, lifeline.torch.state_dict(model, opt))
        time.sleep(0.05)
    ckpt.close()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    with open(os.path.join(out, f"result.{restart}.{rank}.json"), "w") as f:
        json.dump({"loaded": None if loaded is None else int(loaded), "skipped": skipped,
                   "skip_from_load": None if loaded is None else str(loaded.skip_steps),
                   "digest": digest, "finite": finite}, f)
    lifeline.trace.process_exit()
    dist.destroy_process_group()
""")


def _agent():
    return os.path.join(os.environ["LIFELINE_BIN"], "lifeline-agent")


def _lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class RollbackUnderTheAgent(unittest.TestCase):
    def setUp(self):
        base = os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp")
        self.dir = tempfile.mkdtemp(prefix="lifeline-rollback-", dir=base)
        self.addCleanup(shutil.rmtree, self.dir, True)

    def run_job(self, fault, config="", name="job", warmup=50):
        out = os.path.join(self.dir, name)
        os.makedirs(out)
        script = os.path.join(out, "rank.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        cfg = os.path.join(out, "agent.yaml")
        with open(cfg, "w") as f:
            # Spikes: a short warm-up, so that a relaunch from step 20 judges step 25 again.
            f.write(f"training_signals:\n  warmup_steps: {warmup}\n" + config)
        events = os.path.join(out, "events.jsonl")
        r = subprocess.run([_agent(), "run", "--nproc", "2", "--master-port", "0", "--events-log", events,
                            "--config", cfg, "--", sys.executable, script, out, fault],
                           capture_output=True, text=True, timeout=300)
        return r, (_lines(events) if os.path.exists(events) else []), out

    def result(self, out, restart, rank):
        with open(os.path.join(out, f"result.{restart}.{rank}.json")) as f:
            return json.load(f)

    def test_a_nan_on_one_rank_rolls_back_to_the_checkpoint_before_it_and_the_job_ends_as_without_it(self):
        r, lines, out = self.run_job("nan")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        anomalies = [e for e in lines if "kind" in e]
        self.assertEqual([(e["kind"], e["step"], e["ranks"], e["policy"]) for e in anomalies],
                         [("non_finite", 25, [1], "rollback")], anomalies)
        rollbacks = [e for e in lines if e.get("action") == "rollback"]
        self.assertEqual(len(rollbacks), 1, lines)
        rb = rollbacks[0]
        self.assertEqual((rb["anomaly"], rb["anomaly_step"], rb["checkpoint"], rb["repeat"]), ("non_finite", 25, 20, 0))
        self.assertIn("before step 25", rb["why"])
        self.assertIsNone(rb["skipped"])  # the first rollback replays the same data
        self.assertGreaterEqual(rb["steps_rolled_back"], 6)  # 21..26 at least
        # Checkpoints saved at or after the NaN were removed, and none before it.
        self.assertTrue(all(s >= 25 for s in rb["removed"]), rb)
        self.assertEqual(sorted(rb["removed"]), sorted(set(rb["removed"])))
        restarts = [e for e in lines if e.get("action") == "restart"]
        self.assertEqual([(e["reason"], e["rollback"]) for e in restarts], [("non_finite", True)])
        launches = [e for e in lines if e.get("action") == "launch"]
        self.assertEqual(launches[1]["resume"]["step"], 20)
        self.assertTrue(launches[1]["resume"]["rollback"])
        self.assertTrue(any(e.get("action") == "resumed" for e in lines), lines)
        self.assertIn("rolling back to step 20", r.stderr)
        for rank in (0, 1):
            res = self.result(out, 1, rank)
            self.assertEqual(res["loaded"], 20)
            self.assertTrue(res["finite"])
        # The job ends as a run without the fault does: the rollback left none of the NaN behind.
        clean, clean_lines, clean_out = self.run_job("none", name="clean")
        self.assertEqual(clean.returncode, 0, clean.stdout + clean.stderr)
        self.assertEqual([e for e in clean_lines if "kind" in e or e.get("action") == "restart"], [])
        self.assertEqual(self.result(out, 1, 0)["digest"], self.result(clean_out, 0, 0)["digest"])

    def test_a_spike_that_comes_back_is_rolled_back_again_skipping_its_data_and_the_job_finishes(self):
        r, lines, out = self.run_job("spike", "rollback:\n  skip_data: on_repeat\n", warmup=3)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # The loss and the gradient norm both spike at step 25, on the first two launches only.
        spikes = [e for e in lines if e.get("kind") == "spike"]
        self.assertEqual(sorted({(e["restart"], e["step"], e["policy"]) for e in spikes}),
                         [(0, 25, "rollback"), (1, 25, "rollback")], spikes)
        rollbacks = [e for e in lines if e.get("action") == "rollback"]
        self.assertEqual([(e["checkpoint"], e["repeat"], e["skipped"] is None) for e in rollbacks],
                         [(20, 0, True), (20, 1, False)], rollbacks)
        # The second skips every step it rolls back: from the checkpoint's next to the newest reached.
        first, last = (int(s) for s in rollbacks[1]["skipped"].split("-"))
        self.assertEqual(first, 21)
        self.assertGreaterEqual(last, 26)
        self.assertEqual(last, rollbacks[1]["reached_step"])
        launches = [e for e in lines if e.get("action") == "launch"]
        self.assertEqual(len(launches), 3)
        self.assertEqual(launches[2]["resume"]["skip_steps"], rollbacks[1]["skipped"])
        for rank in (0, 1):
            res = self.result(out, 2, rank)
            self.assertEqual(res["loaded"], 20)
            self.assertEqual(res["skipped"], list(range(21, last + 1)))  # the script followed the recipe
            self.assertEqual(res["skip_from_load"], f"StepSet(21-{last})")
            self.assertTrue(res["finite"])
        finished = [e for e in lines if e.get("action") == "finished"]
        self.assertEqual(len(finished), 1, lines)

    def test_a_spike_that_comes_back_without_skipping_its_data_gives_up_saying_why(self):
        r, lines, _ = self.run_job("spike", "rollback:\n  skip_data: never\n  max_per_checkpoint: 2\n", warmup=3)
        self.assertNotEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual([e["checkpoint"] for e in lines if e.get("action") == "rollback"], [20, 20])
        give_up = [e for e in lines if e.get("action") == "rollback_give_up"]
        self.assertEqual(len(give_up), 1, lines)
        self.assertIn("spike at step 25 again after 2 rollbacks to step 20", give_up[0]["reason"])
        self.assertIn("at fault deterministically", r.stderr)


if __name__ == "__main__":
    unittest.main()
