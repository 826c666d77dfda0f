"""Ranks of a torch.distributed (gloo) job started as plain processes, with no agent and no torchrun:
what tests/python/test_launch.py, test_torch_state.py and test_dtensor.py share."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

# The launchers' variables: stripped, so the ranks rely on torch.distributed alone.
LAUNCH_VARS = ("LIFELINE_LAUNCH_ID", "LIFELINE_JOB", "LIFELINE_RESTART", "TORCHELASTIC_RUN_ID",
               "TORCHELASTIC_RESTART_COUNT", "LIFELINE_RESUME_STEP", "LIFELINE_RESUME_DIR", "LIFELINE_AGENT")


def run_ranks(script, world, args_of_rank):
    """Runs `script --worker --rank R --world W --init-method M <args_of_rank(R)>` for every rank, M a
    file store of this launch's own (no port to guess, so none to lose to another process); returns
    each rank's last `RESULT {json}` line (None when it failed) and the output of all of them."""
    store_dir = tempfile.mkdtemp(prefix="lifeline-gloo-", dir=os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp"))
    init_method = "file://" + os.path.join(store_dir, "store")
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    procs = []
    for r in range(world):
        cmd = [sys.executable, os.path.abspath(script), "--worker", "--rank", str(r), "--world", str(world),
               "--init-method", init_method] + args_of_rank(r)
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
    results, outputs = [], []
    for r, p in enumerate(procs):
        try:
            text = p.communicate(timeout=300)[0]
        except subprocess.TimeoutExpired:
            for q in procs:  # no rank outlives the test, hung or not
                q.kill()
            text = p.communicate()[0] + f"\n[rank {r} still running after 300 s: killed]\n"
        outputs.append(text)
        line = [l for l in text.splitlines() if l.startswith("RESULT ")]
        results.append(json.loads(line[-1][7:]) if p.returncode == 0 and line else None)
    shutil.rmtree(store_dir, ignore_errors=True)
    return results, "".join(outputs)


def run_ranks_ok(test, script, world, args_of_rank):
    """run_ranks, failing `test` (naming the rank, with everyone's output) unless every rank
    reported a result; returns (results, output)."""
    results, output = run_ranks(script, world, args_of_rank)
    for r, result in enumerate(results):
        test.assertIsNotNone(result, f"rank {r} failed:\n{output}")
    return results, output


def main(worker, add_arguments=lambda parser: None):
    """A test module's entry point: one rank, `worker(args)`, when run_ranks starts it (--worker,
    with the arguments above and those `add_arguments` declares); the module's tests otherwise."""
    if "--worker" not in sys.argv:
        unittest.main(module="__main__")
        return
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true")
    for name in ("--role", "--dir", "--init-method"):
        p.add_argument(name)
    for name in ("--rank", "--world"):
        p.add_argument(name, type=int)
    add_arguments(p)
    sys.exit(worker(p.parse_args()))


def finish(result):
    """A worker's end: prints its RESULT and leaves the process at once.

    torch 1.13's ProcessGroupGloo can deadlock when it is destroyed (here, with the DDP model that
    holds it, when the worker's locals go): its destructor joins the gloo worker threads while holding
    the GIL, and a worker thread still releasing a finished collective's Python tensors waits for the
    GIL. Seen under load: both threads parked, the rank never exits. The result is out by then, so
    the process ends without tearing the interpreter or the process group down."""
    print("RESULT " + json.dumps(result), flush=True)
    sys.stderr.flush()
    os._exit(0)
