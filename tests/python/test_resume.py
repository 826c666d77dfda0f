"""Training killed with SIGKILL and resumed ends bitwise equal to training that never stopped.

A child process trains a small MLP with Adam, saving lazily every 5 steps (memory tier on), and
SIGKILLs itself in the middle of step 23. Relaunched, it loads the newest checkpoint (step 20) and
trains to step 40. Its parameters and Adam state must equal, bit for bit, those of a run that was
never interrupted; the data of each step depends only on the step, so any lost or stale byte of the
checkpoint shows.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

import torch

import lifeline

STEPS, EVERY, KILL_AT = 40, 5, 23


def make():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    # Adam's state, materialised so that loading fills it in place (a fresh Adam behaves the same).
    for p in model.parameters():
        opt.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
    return model, opt


def state_of(model, opt):
    names = {p: n for n, p in model.named_parameters()}
    return {"model": dict(model.named_parameters()),
            "optim": {names[p]: s for p, s in opt.state.items()},
            "lr": opt.param_groups[0]["lr"]}


def train(directory, kill_at):
    torch.set_num_threads(1)
    model, opt = make()
    state = state_of(model, opt)
    with torch.no_grad():
        ckpt = lifeline.Checkpointer(directory, rank=0, world_size=1, memory_tier=True, keep_last=2)
        start = ckpt.load(state) or 0
    if start:
        print(f"resumed from step {start} ({'memory tier' if ckpt.last_load['from_memory_tier'] else 'disk'})")
    lifeline.guard_optimizer(opt, ckpt)
    for step in range(start + 1, STEPS + 1):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(16, 32, generator=g)
        y = torch.randn(16, 4, generator=g)
        opt.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        opt.step()
        if step % EVERY == 0:
            ckpt.save(step, state)
    ckpt.flush()
    ckpt.close()
    final = {f"model.{k}": v.detach().clone() for k, v in state["model"].items()}
    for name, s in state["optim"].items():
        for k, v in s.items():
            final[f"optim.{name}.{k}"] = v.clone()
    return final


class KillAndResume(unittest.TestCase):
    def setUp(self):
        base = os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp")
        self.dir = tempfile.mkdtemp(prefix="lifeline-resume-", dir=base)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_bitwise_after_sigkill(self):
        ckpt_dir = os.path.join(self.dir, "ckpt")
        child = [sys.executable, os.path.abspath(__file__), "--child", ckpt_dir]
        first = subprocess.run(child + [str(KILL_AT)], capture_output=True, text=True, timeout=120)
        self.assertEqual(first.returncode, -signal.SIGKILL, first.stdout + first.stderr)
        second = subprocess.run(child + ["0"], capture_output=True, text=True, timeout=120)
        self.assertEqual(second.returncode, 0, second.stdout + second.stderr)
        self.assertIn("resumed from step 20", second.stdout)

        reference = train(os.path.join(self.dir, "reference"), kill_at=0)
        resumed = torch.load(os.path.join(self.dir, "ckpt.final.pt"))
        self.assertEqual(sorted(reference), sorted(resumed))
        for k in reference:
            self.assertTrue(torch.equal(reference[k], resumed[k]), f"{k} differs after kill and resume")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        final = train(sys.argv[2], int(sys.argv[3]))
        torch.save(final, sys.argv[2] + ".final.pt")
        sys.exit(0)
    unittest.main()
