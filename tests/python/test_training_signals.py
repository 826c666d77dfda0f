"""Training signals from Python ranks under lifeline-agent (issue 53, items 1 and 2).

A 2-rank gloo DDP job clips its gradients with torch.nn.utils.clip_grad_norm_ and reports its loss
with one line, lifeline.report(loss=loss). At step 25 rank 1's loss becomes NaN; the all-reduce
spreads it to both ranks' gradients. The agent must name rank 1 and step 25 once (non_finite), and
nothing else: DDP's all-reduced norms are bit-identical on both ranks (no disagreement) and a
clean run of 25 steps has no spike. The ranks' rings, dumped at the end, must hold every norm the
unchanged clip_grad_norm_ call returned, bit for bit, under the step it was computed in.

Device values are sent without waiting for the device: a value whose copy has not completed is
sent by a later report, before that report's own values. Without an agent, report() checks its
names and does nothing else.
"""

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
import unittest

DDP_SCRIPT = textwrap.dedent("""
    import json, os, struct, sys
    import torch, torch.distributed as dist
    import lifeline
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + rank)
    norms = []
    for i in range(40):
        x = torch.randn(32, 16, generator=g)
        loss = (model(x) - x[:, :1]).pow(2).mean()
        if rank == 1 and i == 25:
            loss = loss * float("nan")  # a poisoned batch on rank 1
        opt.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lifeline.report(loss=loss)
        norms.append(struct.unpack("<Q", struct.pack("<d", norm.item()))[0])
    out = sys.argv[1]
    with open(os.path.join(out, f"norms.{rank}.json"), "w") as f:
        json.dump(norms, f)
    lifeline.trace.dump(os.path.join(out, f"ring.{rank}.jsonl"), 4096)
    dist.destroy_process_group()
""")

# A value whose device copy has not completed (an event not yet done) is not waited for: the next
# report sends it, first, once done. The copy is played by a host tensor and an event of our own.
DEFERRED_SCRIPT = textwrap.dedent("""
    import os, sys
    import torch
    import lifeline
    from lifeline import trace

    class Event:
        done = False
        def query(self):
            return self.done
        def synchronize(self):
            raise AssertionError("report() waited for the device")

    event = Event()
    trace._in_flight.append((event, torch.tensor(3.5, dtype=torch.float64), 0, 7))
    lifeline.report(loss=1.0, step=8)
    event.done = True
    lifeline.report(loss=2.0, step=9, tokens_per_second=1234.0)
    trace.dump(os.path.join(sys.argv[1], "ring.jsonl"), 100)
""")


def _agent():
    return os.path.join(os.environ["LIFELINE_BIN"], "lifeline-agent")


def _lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class TrainingSignalsUnderTheAgent(unittest.TestCase):
    def setUp(self):
        base = os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp")
        self.dir = tempfile.mkdtemp(prefix="lifeline-signals-", dir=base)
        self.addCleanup(shutil.rmtree, self.dir, True)

    def run_agent(self, script_text, nproc, *flags):
        script = os.path.join(self.dir, "rank.py")
        with open(script, "w") as f:
            f.write(script_text)
        events = os.path.join(self.dir, "events.jsonl")
        r = subprocess.run([_agent(), "run", "--nproc", str(nproc), "--master-port", "0", "--events-log", events,
                            *flags, "--", sys.executable, script, self.dir],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return _lines(events) if os.path.exists(events) else [], r

    def test_a_nan_loss_on_one_rank_is_named_with_its_step_and_clip_norms_arrive(self):
        lines, r = self.run_agent(DDP_SCRIPT, 2)
        anomalies = [e for e in lines if "kind" in e]
        self.assertEqual([e["kind"] for e in anomalies], ["non_finite"], anomalies)
        a = anomalies[0]
        self.assertEqual(a["ranks"], [1])
        self.assertEqual(a["step"], 25)
        # Its policy rolls back by default, but the script keeps no checkpoint the agent knows of:
        # nothing to roll back to, the ranks train on.
        self.assertEqual(a["policy"], "rollback")
        self.assertIn("no checkpoint directory is known", a["not_acted_on"])
        self.assertIn("loss is NaN on rank 1", a["message"])
        # The norms came from the unchanged clip_grad_norm_ calls: NaN on both ranks after the all-reduce.
        self.assertIn("grad_norm is NaN on ranks 0,1", a["message"])
        self.assertIn("non_finite (ranks 1)", r.stderr)

        for rank in (0, 1):
            with open(os.path.join(self.dir, f"norms.{rank}.json")) as f:
                norms = json.load(f)
            events = _lines(os.path.join(self.dir, f"ring.{rank}.jsonl"))
            reported = {e["step"]: e["value_bits"] for e in events
                        if e["type"] == "scalar" and e["scalar"] == 1 and "step" in e}
            self.assertEqual([reported.get(i) for i in range(40)], norms, f"rank {rank}")
            losses = sorted(e["step"] for e in events if e["type"] == "scalar" and e["scalar"] == 0)
            self.assertEqual(losses, list(range(40)))
        # DDP's norm is the same bit for bit on both ranks (the agent compared them: no disagreement).
        with open(os.path.join(self.dir, "norms.0.json")) as f0, open(os.path.join(self.dir, "norms.1.json")) as f1:
            self.assertEqual(json.load(f0)[:25], json.load(f1)[:25])

    def test_device_values_are_sent_later_without_waiting(self):
        self.run_agent(DEFERRED_SCRIPT, 1)
        events = [e for e in _lines(os.path.join(self.dir, "ring.jsonl")) if e["type"].startswith("scalar")]
        got = [(e["type"], e.get("scalar"), e.get("step"), e.get("value"), e.get("name")) for e in events]
        self.assertEqual(got, [
            ("scalar", 0, 8, 1, None),          # the pending copy not done: not waited for
            ("scalar", 0, 7, 3.5, None),        # done by the next report: sent first, with its own step
            ("scalar", 0, 9, 2, None),
            ("scalar_name", 2, None, None, "tokens_per_second"),  # said once, before its first value
            ("scalar", 2, 9, 1234, None),
        ])


class ReportWithoutAnAgent(unittest.TestCase):
    def test_report_checks_names_and_does_nothing_else(self):
        code = textwrap.dedent("""
            import os, time
            os.environ.pop("LIFELINE_AGENT", None)
            import lifeline
            lifeline.report(loss=1.5, grad_norm=0.25, lr=3e-4)
            try:
                lifeline.report(**{"bad name": 1.0})
            except ValueError as e:
                print("refused:", e)
            n = 200000
            t = time.perf_counter()
            for i in range(n):
                lifeline.report(loss=1.5)
            print("per_call_ns", (time.perf_counter() - t) / n * 1e9)
        """)
        env = dict(os.environ)
        env.pop("LIFELINE_AGENT", None)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("refused:", r.stdout)
        self.assertIn("bad name", r.stdout)
        per_call = float(r.stdout.split("per_call_ns")[1])
        self.assertLess(per_call, 50000)  # a bound for a loaded machine, not a benchmark


if __name__ == "__main__":
    unittest.main()
