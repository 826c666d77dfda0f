"""States of thousands of small tensors, as real models with their optimizer state have them.

ckpt.save of a state whose tensors are the objects of the last save reuses that save's
description (lifeline/__init__.py, _SavedTensors), and lifeline.torch.state_dict returns the same
leaves for an unchanged model and optimizer: these tests check that every such shortcut still
saves what the tensors hold at each save, and that any change of structure (a tensor replaced,
its memory moved, optimizer state appearing, a key added) is saved as it is now.
"""

import os
import shutil
import tempfile
import unittest

import torch

import lifeline
import lifeline.torch as lt


def blocks_model(blocks, width=16):
    torch.manual_seed(0)
    layers = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, width), torch.nn.LayerNorm(width)]
    return torch.nn.Sequential(*layers)


def train_step(model, opt, seed):
    g = torch.Generator().manual_seed(seed)
    width = model[0].in_features
    opt.zero_grad()
    model(torch.randn(2, width, generator=g)).square().mean().backward()
    opt.step()


class ManyTensors(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="lifeline-many-", dir=os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp"))

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def expect_loaded(self, ckpt, step, model, opt):
        """Loads `step` into a fresh model and optimizer and compares every tensor with `model`/`opt`."""
        fresh = blocks_model(len(model) // 2, model[0].in_features)
        fresh_opt = torch.optim.Adam(fresh.parameters(), lr=1e-3)
        train_step(fresh, fresh_opt, 999)  # state to be overwritten, of the same structure
        loaded = lt.load(ckpt, fresh, fresh_opt, step=step)
        self.assertEqual(int(loaded), step)
        for (name, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
            self.assertTrue(torch.equal(a, b), f"step {step}: model.{name} differs after the load")
        for p, q in zip(model.parameters(), fresh.parameters()):
            for key, v in opt.state[p].items():
                self.assertTrue(torch.equal(v, fresh_opt.state[q][key]), f"step {step}: optimizer {key} differs")

    def test_saves_of_an_unchanged_model_hold_each_step_values(self):
        model = blocks_model(300)  # 600 parameters, 2,400 tensors with Adam's state
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        train_step(model, opt, 0)
        first = lt.state_dict(model, opt)
        second = lt.state_dict(model, opt)
        # The same leaves for the same tensors: what lets the next save skip describing them.
        self.assertIs(first["model"], second["model"])
        self.assertIs(first["optim"], second["optim"])
        with lifeline.Checkpointer(self.dir, run_id="many") as ckpt:
            for step in range(1, 5):
                t = ckpt.save(step, lt.state_dict(model, opt))
                t.wait_snapshot()
                t.wait()
                if step == 2:
                    self.expect_loaded(ckpt, step, model, opt)
                train_step(model, opt, step)
            # Each step holds that step's values: step 4 was saved before the 4th update.
            snapshot = {k: v.clone() for k, v in model.state_dict().items()}
            t = ckpt.save(5, lt.state_dict(model, opt))
            t.wait()
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)  # after the snapshot: not in step 5
            fresh = blocks_model(300)
            lt.load(ckpt, fresh, step=5, strict=False)
            for name, v in fresh.state_dict().items():
                self.assertTrue(torch.equal(v, snapshot[name]), f"model.{name} of step 5")

    def test_a_changed_structure_is_saved_as_it_is_now(self):
        model = blocks_model(200)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        with lifeline.Checkpointer(self.dir, run_id="changes") as ckpt:
            # 1: no optimizer state yet; 2: Adam's state appeared.
            ckpt.save(1, lt.state_dict(model, opt)).wait()
            train_step(model, opt, 1)
            ckpt.save(2, lt.state_dict(model, opt)).wait()
            self.expect_loaded(ckpt, 2, model, opt)
            # 3: a parameter's memory moved (p.data = ...), same object.
            with torch.no_grad():
                model[0].weight.data = torch.full_like(model[0].weight, 3.5)
            ckpt.save(3, lt.state_dict(model, opt)).wait()
            self.expect_loaded(ckpt, 3, model, opt)
            # 4: a parameter replaced by another object.
            old = model[2].bias
            model[2].bias = torch.nn.Parameter(torch.full_like(old, -2.0))
            opt.state[model[2].bias] = {k: v.clone() for k, v in opt.state.pop(old).items()}
            opt.param_groups[0]["params"][5] = model[2].bias
            ckpt.save(4, lt.state_dict(model, opt)).wait()
            self.expect_loaded(ckpt, 4, model, opt)

    def test_the_header_encoded_in_parts_is_the_header(self):
        from lifeline import _state
        model = blocks_model(50)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        train_step(model, opt, 0)
        for lr in (1e-3, 5e-4):  # the second call reuses the parts; the hyperparameter changed
            opt.param_groups[0]["lr"] = lr
            header = lt.state_dict(model, opt)[lt.HEADER]
            whole = _state.encode_object(lt.HEADER, dict(header))  # a plain dict: encoded in one piece
            self.assertEqual(_state.encode_object(lt.HEADER, header), whole)
            self.assertEqual(_state.decode_object(lt.HEADER, whole)["optim"]["param_groups"][0]["lr"], lr)

    def test_a_plain_state_of_thousands_of_tensors_saved_again_after_each_change(self):
        tensors = {f"expert{i}": torch.full((4, 4), float(i)) for i in range(3000)}
        state = {"experts": tensors, "step": 0}
        with lifeline.Checkpointer(self.dir, run_id="plain") as ckpt:
            expected = {}
            for step in range(1, 7):
                if step == 3:
                    tensors["expert7"] = torch.full((4, 4), 70.0)       # another object
                if step == 4:
                    tensors["expert3000"] = torch.zeros(2)              # a tensor added
                if step == 5:
                    tensors["expert9"].data = torch.full((4, 4), 90.0)  # memory moved
                if step == 6:
                    tensors["expert11"] = torch.arange(32.0).reshape(4, 8)[:, ::2]  # not contiguous
                for v in tensors.values():
                    v.add_(1)
                state["step"] = step
                ckpt.save(step, state).wait()
                expected[step] = {k: v.clone() for k, v in tensors.items()}
            for step, want in expected.items():
                target = {"experts": {k: torch.empty_like(v) for k, v in want.items()}, "step": None}
                self.assertEqual(ckpt.load(target, step=step), step)
                self.assertEqual(target["step"], step)
                for k, v in want.items():
                    self.assertTrue(torch.equal(target["experts"][k], v), f"step {step}: {k}")


if __name__ == "__main__":
    unittest.main()
