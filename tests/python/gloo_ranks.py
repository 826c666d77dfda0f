"""Ranks of a torch.distributed (gloo) job started as plain processes, with no agent and no torchrun:
what tests/python/test_launch.py, test_torch_state.py and test_dtensor.py share.

The ranks are forked from a zygote: an interpreter of the test's own file that imported what the
file imports (torch, lifeline) once, for every launch of the test process, instead of an
interpreter per rank that imports them again (3 s per rank under .venv's torch 2.13, on 2 busy
cores). The zygote runs no tensor operation itself, so its children start from a torch that has
done nothing but import, as a fresh interpreter's. LIFELINE_TEST_FORK_RANKS=0 starts every rank
as its own interpreter instead."""
import argparse
import atexit
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import unittest

_RANK_TIMEOUT_S = 300  # a rank still running then is killed

# The launchers' variables: stripped, so the ranks rely on torch.distributed alone.
LAUNCH_VARS = ("LIFELINE_LAUNCH_ID", "LIFELINE_JOB", "LIFELINE_RESTART", "TORCHELASTIC_RUN_ID",
               "TORCHELASTIC_RESTART_COUNT", "LIFELINE_RESUME_STEP", "LIFELINE_RESUME_DIR", "LIFELINE_AGENT")


def _rank_environment():
    return {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}


def _result(text, exited_0):
    """A rank's last `RESULT {json}` line, when it exited 0; else None."""
    line = [l for l in text.splitlines() if l.startswith("RESULT ")]
    return json.loads(line[-1][7:]) if exited_0 and line else None


def _killed_note(r):
    return f"\n[rank {r} still running after {_RANK_TIMEOUT_S} s: killed]\n"


def run_ranks(script, world, args_of_rank):
    """Runs `script --worker --rank R --world W --init-method M <args_of_rank(R)>` for every rank, M a
    file store of this launch's own (no port to guess, so none to lose to another process); returns
    each rank's last `RESULT {json}` line (None when it failed) and the output of all of them."""
    store_dir = tempfile.mkdtemp(prefix="lifeline-gloo-", dir=os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp"))
    init_method = "file://" + os.path.join(store_dir, "store")
    argvs = [["--worker", "--rank", str(r), "--world", str(world), "--init-method", init_method] + args_of_rank(r)
             for r in range(world)]
    try:
        if os.environ.get("LIFELINE_TEST_FORK_RANKS", "1") != "0":
            return _zygote_of(script).run(argvs, store_dir)
        procs = [subprocess.Popen([sys.executable, os.path.abspath(script)] + argv, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, env=_rank_environment()) for argv in argvs]
        results, outputs = [], []
        for r, p in enumerate(procs):
            try:
                text = p.communicate(timeout=_RANK_TIMEOUT_S)[0]
            except subprocess.TimeoutExpired:
                for q in procs:  # no rank outlives the test, hung or not
                    q.kill()
                text = p.communicate()[0] + _killed_note(r)
            outputs.append(text)
            results.append(_result(text, p.returncode == 0))
        return results, "".join(outputs)
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)


def run_ranks_ok(test, script, world, args_of_rank):
    """run_ranks, failing `test` (naming the rank, with everyone's output) unless every rank
    reported a result; returns (results, output)."""
    results, output = run_ranks(script, world, args_of_rank)
    for r, result in enumerate(results):
        test.assertIsNotNone(result, f"rank {r} failed:\n{output}")
    return results, output


class TrainedRanks:
    """A unittest.TestCase mixin for tests that share one run of the script's ranks with --role
    train into a fresh directory: the class's setUpClass calls cls.train_once(__file__, prefix)."""

    @classmethod
    def train_once(cls, script, prefix, world=4):
        cls.script = script
        cls.dir = tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp"))
        cls.trained, cls.output = run_ranks(script, world, lambda r: ["--role", "train", "--dir", cls.dir])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def ranks(self, world, *args):
        """The results of `world` ranks of the script on the trained directory, given `args`."""
        return run_ranks_ok(self, self.script, world, lambda r: ["--dir", self.dir] + list(args))[0]


class _Zygote:
    """`python SCRIPT --zygote`: reads a launch per line on its stdin (every rank's arguments and
    output file), forks the ranks, says their pids, then their wait statuses, one JSON line each."""

    def __init__(self, script):
        # Unbuffered: a line read must not pull the next one into a buffer select() cannot see.
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(script), "--zygote"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=_rank_environment(), bufsize=0)

    def _line(self, deadline):
        out = self.proc.stdout
        while time.monotonic() < deadline:
            if select.select([out], [], [], max(0.0, min(1.0, deadline - time.monotonic())))[0]:
                line = out.readline()
                if not line:
                    raise RuntimeError(f"the ranks' zygote ended (status {self.proc.wait()})")
                return json.loads(line)
        return None

    def run(self, argvs, directory):
        outs = [os.path.join(directory, f"rank{r}.out") for r in range(len(argvs))]
        self.proc.stdin.write((json.dumps({"ranks": [{"argv": a, "out": o} for a, o in zip(argvs, outs)]}) + "\n").encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + _RANK_TIMEOUT_S
        pids = self._line(deadline)["pids"]
        done = self._line(deadline)
        timed_out = done is None
        if timed_out:  # no rank outlives the test, hung or not
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            done = self._line(time.monotonic() + 60)
        statuses = done["statuses"] if done else [None] * len(argvs)
        results, outputs = [], []
        for r, (out, status) in enumerate(zip(outs, statuses)):
            try:
                with open(out, errors="replace") as f:
                    text = f.read()
            except FileNotFoundError:  # never started
                text = ""
            if timed_out and (status is None or (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL)):
                text += _killed_note(r)
            outputs.append(text)
            results.append(_result(text, status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0))
        return results, "".join(outputs)

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except Exception:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


_zygotes = {}


def _zygote_of(script):
    script = os.path.abspath(script)
    z = _zygotes.get(script)
    if z is None or z.proc.poll() is not None:
        z = _zygotes[script] = _Zygote(script)
    return z


@atexit.register
def _close_zygotes():
    for z in _zygotes.values():
        z.close()


def _serve_as_zygote(run_worker):
    """The zygote's loop (see _Zygote): each rank a forked child running `run_worker(argv)` with
    its stdout and stderr in its own file; its exit status is the worker's."""
    commands = sys.stdin.buffer
    reply = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout.flush()
    os.dup2(2, 1)  # whatever else the zygote prints goes to stderr, never into the replies
    devnull = os.open(os.devnull, os.O_RDONLY)
    for line in commands:
        launch = json.loads(line)
        pids = []
        for rank in launch["ranks"]:
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    fd = os.open(rank["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    os.dup2(fd, 1)
                    os.dup2(fd, 2)
                    os.dup2(devnull, 0)
                    os.close(fd)
                    sys.argv = [sys.argv[0]] + rank["argv"]
                    code = run_worker(rank["argv"]) or 0
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                except BaseException:
                    traceback.print_exc()
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            pids.append(pid)
        reply.write(json.dumps({"pids": pids}) + "\n")
        reply.flush()
        statuses = [os.waitpid(pid, 0)[1] for pid in pids]
        reply.write(json.dumps({"statuses": statuses}) + "\n")
        reply.flush()


def main(worker, add_arguments=lambda parser: None):
    """A test module's entry point: one rank, `worker(args)`, when run_ranks starts it (--worker,
    with the arguments above and those `add_arguments` declares), or the zygote ranks are forked
    from (--zygote); the module's tests otherwise."""
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true")
    for name in ("--role", "--dir", "--init-method"):
        p.add_argument(name)
    for name in ("--rank", "--world"):
        p.add_argument(name, type=int)
    add_arguments(p)
    if "--zygote" in sys.argv:
        _serve_as_zygote(lambda argv: worker(p.parse_args(argv)))
        return
    if "--worker" not in sys.argv:
        unittest.main(module="__main__")
        return
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
