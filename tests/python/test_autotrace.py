"""Python ranks under lifeline-agent are traced with no code change (lifeline_startup/sitecustomize.py
and lifeline/_autotrace.py).

The tutorial-style DDP script tests/python/ddp_tutorial.py (gloo, resnet18, SGD, no
Lifeline code) runs under the agent: its steps and collectives reach the agent; with rank 1
sleeping inside the job the agent names rank 1 alone within the hang timeout; with
--no-python-tracing the agent sees nothing. Smaller scripts check the collectives' names and
numbering, DDP's numerics, the user's own sitecustomize and comm hook, and that the hook never
breaks a script.
"""

import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

from torch_versions import needs_fsdp2

HERE = os.path.dirname(os.path.abspath(__file__))
TUTORIAL = os.path.join(HERE, "ddp_tutorial.py")
FSDP_TUTORIAL = os.path.join(HERE, "fsdp_tutorial.py")
PYTHON = sys.executable
AGENT = os.path.join(os.environ["LIFELINE_BIN"], "lifeline-agent")
HANG_TIMEOUT = 5.0


def _environment(**extra):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the agent makes lifeline importable itself
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _metrics(socket):
    """{(name, labels): value} from the agent's control socket, or None while it is not up."""
    if not os.path.exists(socket):
        return None
    r = subprocess.run([AGENT, "ctl", socket, "metrics"], capture_output=True, text=True, timeout=10)
    if r.returncode != 0:
        return None
    out = {}
    for line in r.stdout.splitlines():
        m = re.match(r"^(\w+)(\{[^}]*\})? (\S+)$", line)
        if m:
            out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


def _counts(metrics):
    steps = sum(v for (n, _), v in metrics.items() if n == "lifeline_steps_total")
    ops = {}
    for (n, labels), v in metrics.items():
        if n == "lifeline_collective_duration_seconds_count":
            ops[re.search(r'op="(\w+)"', labels).group(1)] = v
    return steps, ops


def _epoch(iso):
    return datetime.datetime.strptime(iso, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc).timestamp()


class AutoTrace(unittest.TestCase):
    def setUp(self):
        base = os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp")
        self.dir = tempfile.mkdtemp(prefix="lifeline-autotrace-", dir=base)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def agent(self, command, *flags, env=None, poll_metrics=False, timeout=180):
        """Runs `command` under the agent; returns (returncode, output, events, metric snapshots)."""
        events = os.path.join(self.dir, "events.jsonl")
        if os.path.exists(events):
            os.remove(events)
        run_dir = os.path.join(self.dir, "run")
        shutil.rmtree(run_dir, ignore_errors=True)
        cmd = [AGENT, "run", "--nproc", "2", "--master-port", "0", "--hang-timeout", str(HANG_TIMEOUT),
               "--events-log", events, "--max-restarts", "0", "--run-dir", run_dir, *flags, "--", *command]
        out_path = os.path.join(self.dir, "out.txt")
        snapshots = []
        with open(out_path, "w") as out:
            p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env or _environment())
            deadline = time.time() + timeout
            while p.poll() is None:
                if time.time() > deadline:
                    p.kill()
                    p.wait()
                    self.fail("the agent did not finish in time")
                if poll_metrics:
                    m = _metrics(os.path.join(run_dir, "control.sock"))
                    if m is not None:
                        snapshots.append(m)
                time.sleep(0.25)
        with open(out_path) as f:
            output = f.read()
        lines = []
        if os.path.exists(events):
            with open(events) as f:
                lines = [json.loads(l) for l in f if l.strip()]
        return p.returncode, output, lines, snapshots

    # (a) Events arrive: steps, DDP's gradient all-reduces, its buffer broadcasts; through the
    # traced process group (the default on torch 1.x) and through the comm hook (torch 2.x).
    def test_unchanged_ddp_script_reports_steps_and_collectives(self):
        for mode in ("", "hook"):
            with self.subTest(LIFELINE_DDP_TRACE=mode):
                rc, out, events, snapshots = self.agent([PYTHON, TUTORIAL], "--config", self.calm_config(),
                                                        poll_metrics=True,
                                                        env=_environment(STEPS=30, LIFELINE_DDP_TRACE=mode))
                self.assertEqual(rc, 0, out)
                self.assertIn("rank 1 step 29", out)
                self.assertTrue(snapshots, "no metrics could be read while the job ran:\n" + out)
                steps, ops = _counts(snapshots[-1])
                self.assertGreater(steps, 0, snapshots[-1])
                self.assertGreater(ops.get("allreduce", 0), 0, ops)   # DDP's gradient buckets
                self.assertGreater(ops.get("broadcast", 0), 0, ops)   # DDP's buffer sync before each forward
                self.assertNotIn("Python tracing", out)
                self.assertNotIn("traced through a comm hook", out)  # the group was made where asked
                self.assertEqual([e for e in events if "kind" in e], [], events)

    def calm_config(self):
        """An agent config for the tracing tests: both ranks share 2 busy cores with the other tests,
        so one of them is truly tens of milliseconds late into many collectives and the straggler
        detector (tested in agent/detectors) would rightly say so, and a collective the busy cores
        slow from 19 ms to 48 ms is rightly a slow collective; these tests are about what is traced
        and demand no anomaly at all, so lateness or slowing under a second is no anomaly here."""
        path = os.path.join(self.dir, "calm.yaml")
        with open(path, "w") as f:
            f.write("straggler: {min_lateness_seconds: 1.0}\nslow_collective: {min_excess_seconds: 1.0}\n")
        return path

    # (b) Rank 1 sleeps before step 3: rank 0 waits in the buffer broadcast rank 1 never joins.
    def test_hang_names_rank_1_alone_within_the_timeout(self):
        self.check_hang_names_rank_1(TUTORIAL)

    def check_hang_names_rank_1(self, script):
        rc, out, events, _ = self.agent([PYTHON, script], env=_environment(STEPS=8, HANG_AT=3, HANG_SECONDS=30))
        self.assertNotEqual(rc, 0, out)  # no restart allowed: the agent gives up
        hangs = [e for e in events if e.get("kind") == "hang"]
        self.assertEqual(len(hangs), 1, events)
        self.assertEqual(hangs[0]["ranks"], [1], hangs[0])
        self.assertEqual(hangs[0]["evidence"]["waiting_ranks"], [0], hangs[0])
        # Rank 1 starts sleeping right after it printed step 2.
        m = re.search(r"\[rank 1\] rank 1 step 2 loss \S+ time (\S+)", out)
        self.assertIsNotNone(m, out)
        delay = _epoch(hangs[0]["time"]) - float(m.group(1))
        # The detector's timeout is --hang-timeout or, where the job's own collectives took longer
        # (a loaded machine: one took 1.5 s beside four busy processes), ten times the longest; the
        # rank is named within that timeout, never before it nor before --hang-timeout.
        timeout = hangs[0]["evidence"]["timeout_seconds"]
        self.assertGreaterEqual(timeout, HANG_TIMEOUT - 0.01, hangs[0])
        self.assertGreater(delay, timeout - 0.5, hangs[0])
        self.assertLess(delay, timeout + 2, hangs[0])
        self.assertNotIn("rank 1 step 3", out)

    # (c) --no-python-tracing: the agent sees nothing, and the same sleep goes unnoticed.
    def test_no_python_tracing_sends_nothing(self):
        rc, out, events, snapshots = self.agent([PYTHON, TUTORIAL], "--no-python-tracing",
                                                env=_environment(STEPS=6, HANG_AT=3, HANG_SECONDS=HANG_TIMEOUT + 2),
                                                poll_metrics=True)
        self.assertEqual(rc, 0, out)
        self.assertEqual([e for e in events if "kind" in e], [], events)
        self.assertTrue(snapshots, out)
        for m in snapshots:
            steps, ops = _counts(m)
            self.assertEqual(steps, 0, m)
            self.assertEqual(sum(ops.values()), 0, ops)

    # (d) torch 2.x: an unchanged FSDP2 script reports its steps and FSDP2's all-gathers and
    # reduce-scatters; a rank that sleeps is named alone, its peer waiting in an all-gather.
    @needs_fsdp2
    def test_unchanged_fsdp2_script_reports_steps_and_collectives(self):
        rc, out, events, snapshots = self.agent([PYTHON, FSDP_TUTORIAL], "--config", self.calm_config(),
                                                poll_metrics=True, env=_environment(STEPS=30))
        self.assertEqual(rc, 0, out)
        self.assertIn("rank 1 step 29", out)
        self.assertTrue(snapshots, "no metrics could be read while the job ran:\n" + out)
        steps, ops = _counts(snapshots[-1])
        self.assertGreater(steps, 0, snapshots[-1])
        self.assertGreater(ops.get("allgather", 0), 0, ops)      # parameters gathered for forward/backward
        self.assertGreater(ops.get("reducescatter", 0), 0, ops)  # gradients reduced to their shards
        self.assertNotIn("Python tracing", out)
        self.assertEqual([e for e in events if "kind" in e], [], events)

    @needs_fsdp2
    def test_fsdp2_hang_names_rank_1_alone_within_the_timeout(self):
        self.check_hang_names_rank_1(FSDP_TUTORIAL)  # rank 0 waits in FSDP2's next all-gather

    # Tensor parallelism's collectives are DTensor's functional ones: posted when called, ended
    # when waited for, numbered alike on both ranks; FSDP2's are torch.distributed's.
    @needs_fsdp2
    def test_tensor_parallel_and_fsdp2_collectives_recorded(self):
        script = self.script("""
            import os, sys, torch, torch.distributed as dist
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
            import lifeline, lifeline._autotrace
            rank = int(os.environ["RANK"])
            dist.init_process_group("gloo")
            mesh = init_device_mesh("cpu", (2,))
            def model():
                torch.manual_seed(0)
                return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
            tp = model()
            parallelize_module(tp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
            fsdp = model()
            fully_shard(fsdp, mesh=mesh)
            for phase, m in (("tp", tp), ("fsdp", fsdp)):
                opt = torch.optim.SGD(m.parameters(), lr=0.1)
                for _ in range(2):
                    m(torch.ones(2, 8)).sum().backward()
                    opt.step()
                    opt.zero_grad()
                # An async call's record ends in its future's callback, on gloo's thread, which
                # may run just after the wait returned: let it before dumping.
                lifeline._autotrace._wait_for_callbacks()
                lifeline.trace.dump(sys.argv[1] + f"/{phase}.{rank}.jsonl")
            dist.destroy_process_group()
        """)
        rc, out, _, _ = self.agent([PYTHON, script, self.dir])
        self.assertEqual(rc, 0, out)
        per_phase = {}
        for phase in ("tp", "fsdp"):
            for rank in (0, 1):
                with open(os.path.join(self.dir, f"{phase}.{rank}.jsonl")) as f:
                    evs = [json.loads(l) for l in f if l.strip()]
                begun = [(e["comm"], e["seq"], e.get("op")) for e in evs if e["type"] == "collective_begin"]
                ended = {(e["comm"], e["seq"]) for e in evs if e["type"] == "collective_end"}
                self.assertEqual(ended, {(c, s) for c, s, _ in begun}, f"{phase}, rank {rank}: a collective never ended")
                per_phase.setdefault(phase, {})[rank] = begun
        for phase in ("tp", "fsdp"):
            self.assertEqual(per_phase[phase][0], per_phase[phase][1], f"{phase}: the ranks number collectives apart")
        tp_ops = [o for _, _, o in per_phase["tp"][0]]
        self.assertIn("allreduce", tp_ops)  # RowwiseParallel's partial sums, ColwiseParallel's input gradient
        fsdp_ops = [o for _, _, o in per_phase["fsdp"][0][len(per_phase["tp"][0]):]]
        self.assertIn("allgather", fsdp_ops)
        self.assertIn("reducescatter", fsdp_ops)

    def test_config_file_turns_tracing_off(self):
        config = os.path.join(self.dir, "agent.yaml")
        with open(config, "w") as f:
            f.write("python_tracing: false\n")
        script = self.script("import sys\nprint('hooked', 'lifeline_startup' in ''.join(sys.path))\n")
        rc, out, _, _ = self.agent([PYTHON, script], "--config", config)
        self.assertEqual(rc, 0, out)
        self.assertEqual(out.count("hooked False"), 2, out)

    # DDP's gradients are what its builtin all-reduce makes, bit for bit, traced either way; a
    # comm hook the script registers works (replacing ours in hook mode) and gives the same numbers.
    def test_ddp_numerics_unchanged_and_user_comm_hook_replaces_ours(self):
        def checksum(*flags, **env):
            rc, out, _, _ = self.agent([PYTHON, TUTORIAL], *flags, env=_environment(STEPS=3, PRINT_CHECKSUM=1, **env))
            self.assertEqual(rc, 0, out)
            return re.search(r"checksum (\w+)", out).group(1)

        builtin = checksum("--no-python-tracing")
        self.assertEqual(checksum(), builtin)
        self.assertEqual(checksum(COMM_HOOK="allreduce"), builtin)
        self.assertEqual(checksum(LIFELINE_DDP_TRACE="hook"), builtin)
        self.assertEqual(checksum(LIFELINE_DDP_TRACE="hook", COMM_HOOK="allreduce"), builtin)

    def script(self, text, name="script.py"):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text))
        return path

    # Every rank numbers each communicator's collectives alike; ops get lifeline.trace's names;
    # async calls are posted and end; the script's own lifeline.trace scopes are not doubled.
    def test_collectives_named_and_numbered_alike_on_every_rank(self):
        script = self.script("""
            import os, sys, torch, torch.distributed as dist
            rank = int(os.environ["RANK"])
            dist.init_process_group("gloo")
            g, g2 = dist.new_group([0, 1]), dist.new_group([0, 1])
            t = torch.ones(10)
            dist.all_reduce(t)
            dist.all_reduce(t, group=g, async_op=True).wait()
            dist.all_reduce(t, group=g2)
            dist.broadcast(t, 0)
            dist.barrier()
            dist.all_gather([torch.empty(10), torch.empty(10)], t)
            dist.reduce(t, 0)
            dist.all_to_all_single(torch.empty(4), torch.ones(4))
            if rank == 0:
                dist.send(t, 1)
                dist.irecv(t, 1).wait()
            else:
                dist.recv(t, 0)
                dist.isend(t, 0).wait()
            dist.all_gather_object([None, None], {"rank": rank})
            import lifeline
            with lifeline.trace.collective("allreduce", 40):
                dist.all_reduce(t)
            lifeline.trace.dump(sys.argv[1] + f"/events.{rank}.jsonl")
            dist.destroy_process_group()  # as scripts should: torch 1.13 can abort at exit in gloo otherwise
        """)
        rc, out, _, _ = self.agent([PYTHON, script, self.dir])
        self.assertEqual(rc, 0, out)
        per_rank = []
        for rank in (0, 1):
            with open(os.path.join(self.dir, f"events.{rank}.jsonl")) as f:
                per_rank.append([json.loads(l) for l in f if l.strip()])
        begun = [[(e["comm"], e["seq"], e.get("op")) for e in evs if e["type"] == "collective_begin"] for evs in per_rank]
        p2p = {"send": "p2p", "recv": "p2p"}
        self.assertEqual([(c, s, p2p.get(o, o)) for c, s, o in begun[0]],
                         [(c, s, p2p.get(o, o)) for c, s, o in begun[1]])
        ops = [o for _, _, o in begun[0]]
        self.assertEqual(ops, ["allreduce", "allreduce", "allreduce", "broadcast", "barrier", "allgather", "reduce",
                               "alltoall", "send", "recv", "allgather", "allgather", "allreduce"])
        comms = [c for c, _, _ in begun[0]]
        self.assertEqual(comms[0], 0)
        self.assertNotIn(comms[1], (0, comms[2]))   # two groups over the same ranks: two communicators
        self.assertEqual(comms[8], comms[9])       # point to point: the pair's own communicator
        self.assertNotIn(comms[8], (0, comms[1], comms[2]))
        world = [s for c, s, _ in begun[0] if c == 0]
        self.assertEqual(world, list(range(1, len(world) + 1)))
        for evs in per_rank:
            ended = {(e["comm"], e["seq"]) for e in evs if e["type"] == "collective_end"}
            self.assertEqual(ended, {(c, s) for c, s, _ in begun[0]}, evs)
            posted = {(e["comm"], e["seq"]) for e in evs if e["type"] == "collective_posted"}
            self.assertIn((comms[1], 1), posted)  # the async all-reduce

    # Steps: the optimizer's; nothing before the first optimizer.step() (nor in the one DCP makes to
    # create the optimizer's state), nothing under no_grad.
    def test_steps_come_from_the_optimizer(self):
        script = self.script("""
            import os, sys, torch, torch.distributed as dist
            rank = int(os.environ["RANK"])
            dist.init_process_group("gloo")
            model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
            opt = torch.optim.Adam(model.parameters())
            try:  # torch 2.x: DCP makes Adam's state with a step of its own (lr 0), not a training step
                from torch.distributed.checkpoint.state_dict import get_state_dict
                get_state_dict(model, opt)
            except ImportError:
                pass
            for _ in range(3):
                opt.zero_grad()
                model(torch.ones(3, 4)).sum().backward()
                opt.step()
            with torch.no_grad():
                model(torch.ones(3, 4))
                dist.all_reduce(torch.ones(1))
            import lifeline
            lifeline.trace.dump(sys.argv[1] + f"/events.{rank}.jsonl")
            dist.destroy_process_group()  # as scripts should: torch 1.13 can abort at exit in gloo otherwise
        """)
        rc, out, _, _ = self.agent([PYTHON, script, self.dir])
        self.assertEqual(rc, 0, out)
        with open(os.path.join(self.dir, "events.0.jsonl")) as f:
            evs = [json.loads(l) for l in f if l.strip()]
        marks = [(e["type"], e["step"]) for e in evs if e["type"] in ("step_begin", "step_end")]
        self.assertEqual(marks, [("step_begin", 0), ("step_end", 0), ("step_begin", 1), ("step_end", 1),
                                 ("step_begin", 2), ("step_end", 2)])
        # Steps 1 and 2 began at DDP's forward: their all-reduces are inside them.
        for step in (1, 2):
            begin = next(i for i, e in enumerate(evs) if e["type"] == "step_begin" and e["step"] == step)
            end = next(i for i, e in enumerate(evs) if e["type"] == "step_end" and e["step"] == step)
            self.assertIn("allreduce", [e.get("op") for e in evs[begin:end] if e["type"] == "collective_begin"])

        # python_step_from: none (the agent's LIFELINE_STEP_FROM): collectives only.
        config = os.path.join(self.dir, "agent.yaml")
        with open(config, "w") as f:
            f.write("python_step_from: none\n")
        rc, out, _, _ = self.agent([PYTHON, script, self.dir], "--config", config)
        self.assertEqual(rc, 0, out)
        with open(os.path.join(self.dir, "events.0.jsonl")) as f:
            types = {json.loads(l)["type"] for l in f if l.strip()}
        self.assertNotIn("step_begin", types)
        self.assertIn("collective_begin", types)

    # A relaunch that loads step S goes on at S + 1: the agent's step metrics never run backwards.
    def test_steps_go_on_from_the_loaded_checkpoint(self):
        script = self.script("""
            import os, sys, torch, torch.distributed as dist
            import lifeline, lifeline.torch
            rank = int(os.environ["RANK"])
            dist.init_process_group("gloo")
            model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            ckpt = lifeline.Checkpointer(sys.argv[1] + "/ckpt", rank=rank, world_size=2)
            start = lifeline.torch.load(ckpt, model, opt)
            lifeline.guard_optimizer(opt, ckpt)  # the next update waits for the snapshot: no torn replica
            first = 0 if start is None else start + 1
            for step in range(first, first + 2):
                opt.zero_grad()
                model(torch.ones(3, 4)).sum().backward()
                opt.step()
                ckpt.save(step, lifeline.torch.state_dict(model, opt))
            ckpt.close()
            lifeline.trace.dump(sys.argv[1] + f"/events.{rank}.{first}.jsonl")
            dist.destroy_process_group()  # as scripts should: torch 1.13 can abort at exit in gloo otherwise
        """)
        for first in (0, 2):
            rc, out, _, _ = self.agent([PYTHON, script, self.dir])
            self.assertEqual(rc, 0, out)
            with open(os.path.join(self.dir, f"events.0.{first}.jsonl")) as f:
                evs = [json.loads(l) for l in f if l.strip()]
            self.assertEqual([e["step"] for e in evs if e["type"] == "step_end"], [first, first + 1], evs)

    # Issue 32, item 14: a script counting steps from 1 (as torchtitan does) saw hangs named one
    # step less than its own. Its first save tells the clock its numbering.
    def test_a_script_counting_from_one_gets_its_own_step_numbers_after_its_first_save(self):
        script = self.script("""
            import os, sys, torch, torch.distributed as dist
            import lifeline
            rank = int(os.environ["RANK"])
            dist.init_process_group("gloo")
            model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            ckpt = lifeline.Checkpointer(sys.argv[1] + "/ckpt", rank=rank, world_size=2)
            for step in range(1, 5):
                opt.zero_grad()
                model(torch.ones(3, 4)).sum().backward()
                opt.step()
                if step % 2 == 0:
                    ckpt.save(step, {"w": lifeline.Shard(model.module.weight.detach().clone(), replica=(rank, 2))})
            ckpt.close()
            lifeline.trace.dump(sys.argv[1] + f"/events.{rank}.jsonl")
            dist.destroy_process_group()
        """)
        rc, out, _, _ = self.agent([PYTHON, script, self.dir])
        self.assertEqual(rc, 0, out)
        with open(os.path.join(self.dir, "events.0.jsonl")) as f:
            evs = [json.loads(l) for l in f if l.strip()]
        self.assertEqual([e["step"] for e in evs if e["type"] == "step_end"], [0, 1, 3, 4], evs)

    def test_user_sitecustomize_still_runs_and_plain_python_pays_nothing(self):
        user = os.path.join(self.dir, "user_site")
        os.makedirs(user)
        with open(os.path.join(user, "sitecustomize.py"), "w") as f:
            f.write("import os\nos.environ['USER_SITECUSTOMIZE'] = 'ran'\n")
        script = self.script("""
            import os, sys
            print("user", os.environ.get("USER_SITECUSTOMIZE"), "torch" in sys.modules, "lifeline" in sys.modules)
        """)
        env = _environment()
        env["PYTHONPATH"] = user
        rc, out, _, _ = self.agent([PYTHON, script], env=env)
        self.assertEqual(rc, 0, out)
        self.assertEqual(out.count("user ran False False"), 2, out)
        # Outside the agent the hook does nothing (but still chains).
        startup = os.path.join(os.path.dirname(os.environ["LIFELINE_BIN"]), "python", "lifeline_startup")
        env = _environment(PYTHONPATH=startup + ":" + user)
        env.pop("LIFELINE_AGENT", None)
        r = subprocess.run([PYTHON, "-c", "import sys, os, torch.distributed;"
                            "print(os.environ.get('USER_SITECUSTOMIZE'), 'lifeline' in sys.modules,"
                            "hasattr(torch.distributed.all_reduce, '_lifeline_traced'))"],
                           env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.stdout.split(), ["ran", "False", "False"], r.stdout + r.stderr)

    # A script that never calls destroy_process_group and exits right after a backward (DDP's
    # bucket callbacks still being released by gloo's thread) exits cleanly: the hook's callbacks
    # are let go before the interpreter finalizes. Before, about 4 runs in 10 died with SIGABRT
    # ("terminate called without an active exception") and the agent counted a dead rank: 8 runs
    # would all pass that bug about once in 60 tries (0.6 ** 8).
    def test_a_script_exiting_right_after_backward_exits_cleanly(self):
        script = self.script("""
            import torch, torch.distributed as dist, torch.nn as nn
            dist.init_process_group("gloo")
            model = nn.parallel.DistributedDataParallel(
                nn.Sequential(*[nn.Linear(64, 64) for _ in range(40)]), bucket_cap_mb=0.01)
            for _ in range(2):
                model(torch.randn(4, 64)).sum().backward()
        """)
        for run in range(8):
            rc, out, _, _ = self.agent([PYTHON, script])
            self.assertEqual(rc, 0, f"run {run}:\n{out}")
            self.assertNotIn("terminate called", out)

    # Ranks other than 0 wait for rank 0's store before init_process_group asks for it (rank 0
    # opens it late here): every way of calling it still initialises, and tracing goes on.
    def test_init_process_group_waits_for_the_store_in_every_form(self):
        script = self.script("""
            import os, sys, time, torch, torch.distributed as dist
            form = sys.argv[1]
            rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            if rank == 0:
                time.sleep(2)  # the store opens late
            if form == "env":
                dist.init_process_group("gloo")
            elif form == "explicit":
                dist.init_process_group(backend="gloo", init_method="env://", rank=rank, world_size=size)
            else:
                address = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
                dist.init_process_group("gloo", address, rank=rank, world_size=size)
            t = torch.ones(2)
            dist.all_reduce(t)
            print("sum", t.sum().item(), flush=True)
            os._exit(0)  # torch 1.13's gloo teardown can deadlock (tests/python/gloo_ranks.py)
        """)
        for form in ("env", "explicit", "tcp"):
            with self.subTest(form=form):
                rc, out, _, _ = self.agent([PYTHON, script, form])
                self.assertEqual(rc, 0, out)
                self.assertEqual(out.count("sum 4.0"), 2, out)
                self.assertNotIn("Python tracing stopped", out)

    def test_a_broken_hook_never_breaks_the_script(self):
        # A `lifeline` that fails to import stands in for any failure of the hook.
        broken = os.path.join(self.dir, "broken", "lifeline")
        os.makedirs(broken)
        with open(os.path.join(broken, "__init__.py"), "w") as f:
            f.write("raise RuntimeError('broken on purpose')\n")
        script = self.script("""
            import torch, torch.distributed as dist
            dist.init_process_group("gloo")
            t = torch.ones(2)
            dist.all_reduce(t)
            print("sum", t.sum().item())
            dist.destroy_process_group()
        """)
        rc, out, _, _ = self.agent([PYTHON, script], env=_environment(PYTHONPATH=os.path.dirname(broken)))
        self.assertEqual(rc, 0, out)
        self.assertEqual(out.count("sum 4.0"), 2, out)
        for rank in (0, 1):
            said = [l for l in out.splitlines() if l.startswith(f"[rank {rank}]") and "Python tracing is off" in l]
            self.assertEqual(len(said), 1, out)
            self.assertIn("broken on purpose", said[0])


if __name__ == "__main__":
    unittest.main()
