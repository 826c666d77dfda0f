"""lifeline.torch: models and optimizers saved by parameter name, DDP and plain interchangeable (issue 18).

Two gloo ranks (subprocesses joined by torch.distributed, no torchrun) train a DDP model with
BatchNorm and Adam and save it with lifeline.torch.state_dict; one process loads that into a plain
model and a fresh Adam and finds every parameter, buffer, moment and hyperparameter equal to the
DDP run's, saves it again, and the two ranks load that back into DDP. A DDP model's plain
state_dict() saved from both ranks fails on both and completes no step.
"""
import os
import shutil
import tempfile
import unittest

import torch

import gloo_ranks
import lifeline
import lifeline.torch

STEPS = 3
LR = 0.01


def make_model():
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5), torch.nn.ReLU(), torch.nn.Linear(5, 2))


def make_optimizer(model, lr=LR):
    return torch.optim.Adam(model.parameters(), lr=lr, betas=(0.8, 0.95), weight_decay=0.01)


def batch(rank, step):
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(8, 6, generator=g)


def reference(model, optimizer):
    """What a checkpoint must give back: tensors by parameter name, and the hyperparameters."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {"model": {k: v.clone() for k, v in model.state_dict().items()},
            "optim": {names[id(p)]: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
                      for p, s in optimizer.state.items()},
            "groups": [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]}


def differences(model, optimizer, ref):
    """Every way `model` and `optimizer` differ from `ref`, exactly (bitwise)."""
    out = []
    got = reference(model, optimizer)
    for key in ("model", "optim"):
        if sorted(got[key]) != sorted(ref[key]):
            out.append(f"{key} names {sorted(got[key])} != {sorted(ref[key])}")
    for name, t in ref["model"].items():
        if name in got["model"] and not (t.dtype == got["model"][name].dtype and torch.equal(t, got["model"][name])):
            out.append(f"model.{name}")
    for name, state in ref["optim"].items():
        for k, v in state.items():
            mine = got["optim"].get(name, {}).get(k, "absent")
            same = (isinstance(mine, torch.Tensor) and mine.dtype == v.dtype and mine.shape == v.shape
                    and torch.equal(mine, v)) if isinstance(v, torch.Tensor) else (type(mine) is type(v) and mine == v)
            if not same:
                out.append(f"optim.{name}.{k}: {mine!r} != {v!r}")
    if got["groups"] != ref["groups"]:
        out.append(f"param_groups {got['groups']} != {ref['groups']}")
    return out


def worker(args):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=args.init_method, rank=args.rank,
                            world_size=args.world)
    ckpt = lifeline.Checkpointer(args.dir, rank=args.rank, world_size=args.world)
    model = torch.nn.parallel.DistributedDataParallel(make_model())
    optimizer = make_optimizer(model, lr=LR if args.role != "load" else 0.5)
    out = {}
    if args.role in ("save", "save_plain"):
        for step in range(1, STEPS + 1):
            optimizer.zero_grad()
            model(batch(args.rank, step)).square().sum().backward()
            optimizer.step()
        out["running_mean"] = model.module[1].running_mean.tolist()
        if args.role == "save":
            if args.rank == 0:
                torch.save(reference(model.module, optimizer), args.ref)
            ckpt.save(STEPS, lifeline.torch.state_dict(model, optimizer)).wait()
            out["saved"] = STEPS
        else:
            try:
                ckpt.save(STEPS, {"model": model.module.state_dict()}).wait()
                out["error"] = None
            except lifeline.Error as e:
                out["error"] = str(e)
    else:
        out["loaded"] = lifeline.torch.load(ckpt, model, optimizer, required=True)
        out["differences"] = differences(model.module, optimizer, torch.load(args.ref))
    ckpt.close()
    dist.destroy_process_group()
    gloo_ranks.finish(out)


def run_ranks(directory, role, ref, world=2):
    return gloo_ranks.run_ranks(__file__, world, lambda r: ["--role", role, "--dir", directory, "--ref", ref])


def complete_steps(directory):
    return [c["step"] for c in lifeline.Checkpointer(directory, rank=0, world_size=1).list() if c["complete"]]


class TorchState(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="lifeline-torch-", dir=os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp"))
        self.dir = os.path.join(self.tmp, "ckpt")
        self.ref = os.path.join(self.tmp, "ref.pt")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_ddp_checkpoint_loads_into_a_plain_model_and_back(self):
        results, out = run_ranks(self.dir, "save", self.ref)
        self.assertTrue(all(results), out)
        # The ranks' BatchNorm statistics differ: the checkpoint must hold rank 0's, which DDP broadcasts.
        self.assertNotEqual(results[0]["running_mean"], results[1]["running_mean"])
        ref = torch.load(self.ref)
        self.assertTrue(all(not n.startswith("module.") for n in ref["model"]))

        model = make_model()
        for p in model.parameters():
            p.data.zero_()
        optimizer = make_optimizer(model, lr=0.5)  # fresh: no state, another lr
        ckpt = lifeline.Checkpointer(self.dir)
        step = lifeline.torch.load(ckpt, model, optimizer)
        self.assertEqual(step, STEPS)
        self.assertEqual((step.missing_keys, step.unexpected_keys), ([], []))
        self.assertEqual(differences(model, optimizer, ref), [])
        self.assertEqual(optimizer.param_groups[0]["lr"], LR)
        # Training goes on from the loaded state as it would have from the saved one.
        twin = make_model()
        twin.load_state_dict(ref["model"])
        twin_opt = make_optimizer(twin)
        names = dict(twin.named_parameters())
        twin_opt.load_state_dict({"state": {i: ref["optim"][n] for i, n in enumerate(names)},
                                  "param_groups": [dict(ref["groups"][0], params=list(range(len(names))))]})
        for m, o in ((model, optimizer), (twin, twin_opt)):
            o.zero_grad()
            m(batch(0, 9)).square().sum().backward()
            o.step()
        self.assertEqual(differences(model, optimizer, reference(twin, twin_opt)), [])

        # Saved by the plain model, loaded by two DDP ranks into fresh optimizers.
        other = os.path.join(self.tmp, "plain")
        model = make_model()
        optimizer = make_optimizer(model, lr=0.5)
        lifeline.torch.load(ckpt, model, optimizer)
        ckpt.close()
        with lifeline.Checkpointer(other) as plain:
            plain.save(STEPS, lifeline.torch.state_dict(model, optimizer)).wait()
        results, out = run_ranks(other, "load", self.ref)
        self.assertTrue(all(results), out)
        for r in results:
            self.assertEqual(r["loaded"], STEPS, out)
            self.assertEqual(r["differences"], [], out)

    def test_plain_state_dict_of_ddp_ranks_fails_on_every_rank(self):
        results, out = run_ranks(self.dir, "save_plain", self.ref)
        self.assertTrue(all(results), out)
        for r in results:
            self.assertIsNotNone(r["error"], out)
            self.assertIn("model.", r["error"])
            self.assertIn("ranks 0 and 1", r["error"])
            self.assertIn("lifeline.torch.state_dict", r["error"])
        self.assertEqual(complete_steps(self.dir), [])

    def test_strict_load_reports_every_missing_and_unexpected_key(self):
        model = make_model()
        saved_optimizer = make_optimizer(model)
        saved_optimizer.zero_grad()
        model(batch(0, 1)).sum().backward()
        saved_optimizer.step()
        with lifeline.Checkpointer(self.dir) as ckpt:
            ckpt.save(1, lifeline.torch.state_dict(model, saved_optimizer)).wait()
            # Another model: layer 3 renamed to 4 (missing 4.*, unexpected 3.*), one more Linear (missing 5.*).
            other = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5), torch.nn.ReLU(),
                                        torch.nn.Identity(), torch.nn.Linear(5, 2), torch.nn.Linear(2, 2))
            before = [t.clone() for t in other.state_dict().values()]
            with self.assertRaises(lifeline.Error) as caught:
                lifeline.torch.load(ckpt, other, make_optimizer(other))
            message = str(caught.exception)
            self.assertEqual(caught.exception.code, "InvalidArgument")
            for key in ("model.4.weight", "model.4.bias", "model.5.weight", "model.5.bias",
                        "model.3.weight", "model.3.bias", "optim.param_groups.0.5.weight"):
                self.assertIn(key, message)
            self.assertTrue(all(torch.equal(a, b) for a, b in zip(before, other.state_dict().values())),
                            "a failed strict load changed the model")

            optimizer = make_optimizer(other)
            step = lifeline.torch.load(ckpt, other, optimizer, strict=False)
            self.assertEqual(step, 1)
            self.assertEqual(sorted(step.missing_keys),
                             sorted(["model.4.weight", "model.4.bias", "model.5.weight", "model.5.bias",
                                     "optim.param_groups.0.4.weight", "optim.param_groups.0.4.bias",
                                     "optim.param_groups.0.5.weight", "optim.param_groups.0.5.bias"]))
            self.assertEqual(sorted(step.unexpected_keys),
                             sorted(["model.3.weight", "model.3.bias",
                                     "optim.param_groups.0.3.weight", "optim.param_groups.0.3.bias"]))
            self.assertTrue(torch.equal(other[0].weight, model[0].weight))
            self.assertTrue(torch.equal(optimizer.state[other[0].weight]["exp_avg"],
                                        saved_optimizer.state[model[0].weight]["exp_avg"]))

            # A shape mismatch is an error even when not strict.
            wider = torch.nn.Sequential(torch.nn.Linear(6, 7))
            with self.assertRaisesRegex(lifeline.Error, r"model\.0\.weight: the checkpoint holds f32 \[5, 6\]"):
                lifeline.torch.load(ckpt, wider, strict=False)
            # So is another optimizer's state.
            with self.assertRaisesRegex(lifeline.Error, "the checkpoint holds the state of Adam, the optimizer is SGD"):
                lifeline.torch.load(ckpt, model, torch.optim.SGD(model.parameters(), lr=0.1))

    def test_each_optimizer_resumes_exactly_from_a_fresh_instance(self):
        makers = {
            "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
            "sgd_plain": lambda ps: torch.optim.SGD(ps, lr=0.1),
            "adamw_amsgrad": lambda ps: torch.optim.AdamW(ps, lr=0.01, amsgrad=True),
            "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.5, centered=True),
            "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.1),
        }
        for kind, make in makers.items():
            with self.subTest(kind):
                model = make_model()
                optimizer = make(model.parameters())
                for step in (1, 2):
                    optimizer.zero_grad()
                    model(batch(0, step)).square().sum().backward()
                    optimizer.step()
                directory = os.path.join(self.tmp, kind)
                with lifeline.Checkpointer(directory) as ckpt:
                    ckpt.save(2, lifeline.torch.state_dict(model, optimizer)).wait()
                fresh = make_model()
                fresh_optimizer = make(fresh.parameters())
                with lifeline.Checkpointer(directory) as ckpt:
                    self.assertEqual(lifeline.torch.load(ckpt, fresh, fresh_optimizer), 2)
                self.assertEqual(differences(fresh, fresh_optimizer, reference(model, optimizer)), [])
                for m, o in ((model, optimizer), (fresh, fresh_optimizer)):
                    o.zero_grad()
                    m(batch(0, 3)).square().sum().backward()
                    o.step()
                self.assertEqual(differences(fresh, fresh_optimizer, reference(model, optimizer)), [])

    def test_a_damaged_newest_checkpoint_is_passed_over(self):
        model = make_model()
        optimizer = make_optimizer(model)
        with lifeline.Checkpointer(self.dir) as ckpt:
            for step in (1, 2):
                optimizer.zero_grad()
                model(batch(0, step)).square().sum().backward()
                optimizer.step()
                if step == 1:
                    ref = reference(model, optimizer)
                ckpt.save(step, lifeline.torch.state_dict(model, optimizer)).wait()
        step2 = os.path.join(self.dir, "step-00000000000000000002")
        data = [n for n in os.listdir(step2) if n.endswith(".data")][0]
        with open(os.path.join(step2, data), "r+b") as f:  # a bit of the first chunk's data
            f.seek(4096 + 8)
            b = f.read(1)
            f.seek(4096 + 8)
            f.write(bytes([b[0] ^ 0x10]))
        fresh = make_model()
        fresh_optimizer = make_optimizer(fresh, lr=0.5)
        with lifeline.Checkpointer(self.dir) as ckpt:
            with self.assertWarnsRegex(RuntimeWarning, "step 2 .*loaded step 1"):
                self.assertEqual(lifeline.torch.load(ckpt, fresh, fresh_optimizer), 1)
            self.assertEqual([s["step"] for s in ckpt.last_load["skipped"]], [2])
        self.assertEqual(differences(fresh, fresh_optimizer, ref), [])

    def test_required_load_fails_for_a_directory_without_checkpoints(self):
        empty = os.path.join(self.tmp, "typo")
        with lifeline.Checkpointer(empty) as ckpt:
            self.assertIsNone(lifeline.torch.load(ckpt, make_model()))
            with self.assertRaisesRegex(lifeline.Error, "no checkpoint in " + empty) as caught:
                lifeline.torch.load(ckpt, make_model(), required=True)
            self.assertEqual(caught.exception.code, "NotFound")
            self.assertIsNone(ckpt.load({"w": torch.zeros(2)}))
            with self.assertRaisesRegex(lifeline.Error, "no checkpoint in " + empty):
                ckpt.load({"w": torch.zeros(2)}, required=True)

    def test_a_checkpoint_not_made_by_state_dict_is_named(self):
        with lifeline.Checkpointer(self.dir) as ckpt:
            ckpt.save(1, {"model": make_model().state_dict()}).wait()
            with self.assertRaisesRegex(lifeline.Error, "not saved from lifeline.torch.state_dict"):
                lifeline.torch.load(ckpt, make_model())


if __name__ == "__main__":
    gloo_ranks.main(worker, lambda p: p.add_argument("--ref"))
