"""The DCP path under lifeline-agent, as a user meets it (issue 51): an FSDP2 job saving through
dcp.async_save with lifeline.dcp and resuming through dcp.load reports to the agent what the same
job through lifeline.Checkpointer reports (the resumed step and its source, steps redone, the step
clock, metrics); its memory tier is empty once the job ends; async_save on the default group is
warned of; mistakes no relaunch cures end the job at once with the rank's own error; a stop by
SIGINT and a hang say what the user needs. The job: tests/python/dcp_agent_job.py.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

from torch_versions import no_fsdp2

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "dcp_agent_job.py")
TUTORIAL = os.path.join(HERE, "fsdp_tutorial.py")


def read_events(path):
    import json
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def metric(text, name):
    m = re.search(r"^" + re.escape(name) + r"(?:\{[^}]*\})? (\S+)$", text, re.M)
    return None if m is None else float(m.group(1))


class DcpUnderTheAgent(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        reason = no_fsdp2()
        if reason:
            raise unittest.SkipTest(reason)
        base = os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp")
        cls.dir = tempfile.mkdtemp(prefix="lifeline-dcp-agent-", dir=base)
        cls.addClassCleanup(shutil.rmtree, cls.dir, ignore_errors=True)
        cls.agent = os.path.join(os.environ["LIFELINE_BIN"], "lifeline-agent")
        cls.lifeline = os.path.join(os.environ["LIFELINE_BIN"], "lifeline")

    def start(self, name, args, agent_flags=(), command=None, env=None, tell_agent=False, restarts=2):
        """Starts an agent running the job with `args` (its directory NAME.ckpt, also the agent's
        --checkpoint-dir with tell_agent); returns (process, paths)."""
        paths = {k: os.path.join(self.dir, f"{name}.{k}") for k in ("events", "out", "tier", "run", "ckpt", "hold")}
        environment = dict(os.environ, LIFELINE_MEMORY_TIER_DIR=paths["tier"], **(env or {}))
        cmd = [self.agent, "run", "--nproc", "2", "--max-restarts", str(restarts), "--master-port", "0", "--events-log", paths["events"],
               "--run-dir", paths["run"], *agent_flags]
        cmd += (["--checkpoint-dir", paths["ckpt"]] if tell_agent else []) + ["--"]
        cmd += command or [sys.executable, JOB, "--dir", paths["ckpt"], *args]
        out = open(paths["out"], "w+")
        self.addCleanup(out.close)
        proc = subprocess.Popen(cmd, env=environment, stdout=out, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        self.addCleanup(self.stop, proc)
        return proc, paths

    @staticmethod
    def stop(proc):
        """Ends an agent a failed test left running: SIGTERM makes it stop its ranks first."""
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def finish(self, proc, paths, timeout=240):
        """The agent's exit code and output once it exits."""
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop(proc)
            self.fail(f"the agent did not end in {timeout} s:\n{open(paths['out']).read()}")
        with open(paths["out"]) as f:
            return proc.returncode, f.read()

    def wait_for(self, path, proc, paths, seconds=180):
        deadline = time.monotonic() + seconds
        while not os.path.exists(path):
            if proc.poll() is not None or time.monotonic() > deadline:
                self.fail(f"{path} never appeared:\n{open(paths['out']).read()}")
            time.sleep(0.05)

    def tier_steps(self, paths):
        """The step directories left in the job's memory tier (any checkpoint directory's root)."""
        found = []
        for root, dirs, _files in os.walk(paths["tier"]):
            found += [f"{os.path.join(root, d)}: {sorted(os.listdir(os.path.join(root, d)))}"
                      for d in dirs if d.startswith("step-")]
        return found

    def run_killed_job(self, path):
        """The job through `path`, rank 1 killed as it begins step 12 at the first launch, held at its end
        while the agent's metrics are read. Returns (events, metrics text, output, paths)."""
        hold = os.path.join(self.dir, path + ".hold")
        proc, paths = self.start(path, ["--path", path, "--kill-at", "12", "--hold", hold], tell_agent=True)
        self.wait_for(hold + ".holding", proc, paths)
        # The last save is durable: rank 0 holds after upload_completion (or close) returned.
        metrics = subprocess.run([self.agent, "ctl", os.path.join(paths["run"], "control.sock"), "metrics"],
                                 capture_output=True, text=True, timeout=30).stdout
        open(hold, "w").close()
        code, output = self.finish(proc, paths)
        self.assertEqual(code, 0, output)
        return read_events(paths["events"]), metrics, output, paths

    def test_dcp_and_checkpointer_jobs_killed_alike_report_alike_and_leave_the_tier_empty(self):
        reports = {}
        for path in ("dcp", "native"):
            events, metrics, output, paths = self.run_killed_job(path)
            resumed = [e for e in events if e.get("action") == "resumed"]
            lost = [e for e in events if e.get("action") == "time_lost"]
            finished = [e for e in events if e.get("action") == "finished"]
            self.assertEqual(len(resumed), 1, output)
            self.assertEqual(len(finished), 1, output)
            final = re.findall(r"final (\S+)", output)
            self.assertEqual(len(final), 1, output)
            # Steps redone: step 11, and step 12 when rank 0's beginning of it reached the agent
            # before rank 1's death did (timing decides); never more (the DCP path once said 34).
            redone = {lost[0]["steps_redone"], finished[0]["time"]["steps_redone"],
                      metric(metrics, "lifeline_steps_redone_total")}
            self.assertEqual(len(redone), 1, f"{path}: the events and the metric disagree: {redone}")
            self.assertIn(redone.pop(), (0, 1, 2), f"{path}:\n{output}")
            reports[path] = {
                "resumed": {k: resumed[0].get(k) for k in ("resumed_from_checkpoint", "source", "step")},
                "resumed_step": lost[0]["resumed_step"],
                "metrics": {name: metric(metrics, name) for name in
                            ("lifeline_step", "lifeline_restarts_total", "lifeline_checkpoint_last_committed_step")},
                "final": final[0],
            }
            self.assertEqual(reports[path]["resumed"], {"resumed_from_checkpoint": 10, "source": "memory", "step": 11},
                             f"{path}:\n{output}")
            self.assertIn("resumed at step 11", output)
            self.assertGreater(finished[0]["time"]["ettr"], 0.0)
            self.assertEqual(self.tier_steps(paths), [], f"{path}: snapshots left in the memory tier")
            if path == "dcp":
                self.assertIn("loaded step 10 from memory", output)
        self.assertEqual(reports["dcp"], reports["native"])
        # The step clock went on from the loaded step (not from 0): 29 ended, and the digest's
        # collectives after it opened step 30.
        self.assertEqual(reports["dcp"]["metrics"]["lifeline_step"], 30.0, reports)
        self.assertEqual(reports["dcp"]["metrics"]["lifeline_checkpoint_last_committed_step"], 29.0, reports)

    def test_a_writer_never_closed_leaves_no_snapshot_and_one_ending_on_an_error_keeps_them(self):
        proc, paths = self.start("never", ["--path", "dcp", "--close", "never"])
        code, output = self.finish(proc, paths)
        self.assertEqual(code, 0, output)
        self.assertEqual(self.tier_steps(paths), [], "the interpreter's end closes an open writer")
        # The first launch ends on its own error after its save of step 15: its snapshots stay for
        # the relaunch, which resumes from memory, and the job's end frees them.
        proc, paths = self.start("error", ["--path", "dcp", "--close", "exception"])
        code, output = self.finish(proc, paths)
        self.assertEqual(code, 0, output)
        resumed = [e for e in read_events(paths["events"]) if e.get("action") == "resumed"]
        self.assertEqual([(e["resumed_from_checkpoint"], e["source"]) for e in resumed], [(15, "memory")], output)
        self.assertEqual(self.tier_steps(paths), [])

    def test_async_save_on_the_default_group_is_warned_of(self):
        proc, paths = self.start("nogroup", ["--path", "dcp", "--no-group", "--steps", "6"])
        code, output = self.finish(proc, paths)
        self.assertEqual(code, 0, output)
        for rank in (0, 1):
            warnings = re.findall(rf"^\[rank {rank}\] .*RuntimeWarning: lifeline.dcp: dcp.async_save was given no "
                                  r"process_group.*new_group\(backend=\"gloo\"\)\)$", output, re.M)
            self.assertEqual(len(warnings), 1, output)  # once per writer, not per save

    def test_mistakes_no_relaunch_cures_end_the_job_at_once_with_the_ranks_error(self):
        # The script's directory is a file (the agent was not told it).
        afile = os.path.join(self.dir, "a-file")
        with open(afile, "w") as f:
            f.write("not a directory\n")
        proc, paths = self.start("file", [], command=[sys.executable, JOB, "--dir", afile, "--path", "dcp"])
        code, output = self.finish(proc, paths)
        self.assertEqual(code, 1, output)
        launches = [e for e in read_events(paths["events"]) if e.get("action") == "launch"]
        self.assertEqual(len(launches), 1, output)
        self.assertIn("lifeline.Error: FailedPrecondition: " + afile + ": is a file, not a directory", output)
        self.assertIn("ended on a checkpoint failure no relaunch cures", output)
        # Told to the agent: refused before any launch.
        proc, paths = self.start("flag", [], ["--checkpoint-dir", afile], command=["true"])
        code, output = self.finish(proc, paths)
        self.assertEqual(code, 2, output)
        self.assertIn(f"--checkpoint-dir {afile}: is a file, not a directory", output)
        # A directory another job saves into, the agent not told of it: the second job's saves fail
        # at its first checkpoint and it ends at once; the first job goes on.
        first, first_paths = self.start("holder", ["--path", "native", "--hold", os.path.join(self.dir, "holder.hold")])
        self.wait_for(os.path.join(self.dir, "holder.hold.holding"), first, first_paths)
        proc, paths = self.start("second", [], command=[sys.executable, JOB, "--dir", first_paths["ckpt"], "--path", "native",
                                                          "--steps", "40"])
        code, output = self.finish(proc, paths)
        self.assertEqual(code, 1, output)
        self.assertEqual(len([e for e in read_events(paths["events"]) if e.get("action") == "launch"]), 1, output)
        self.assertIn("ended on a checkpoint failure no relaunch cures (FailedPrecondition", output)
        open(os.path.join(self.dir, "holder.hold"), "w").close()
        code, output = self.finish(first, first_paths)
        self.assertEqual(code, 0, output)

    def test_a_fresh_start_a_stop_by_sigint_and_a_hang_say_what_happened(self):
        proc, paths = self.start("sigint", ["--path", "dcp", "--hold", os.path.join(self.dir, "sigint.hold")],
                                 tell_agent=True)
        self.wait_for(os.path.join(self.dir, "sigint.hold.holding"), proc, paths)
        proc.send_signal(signal.SIGINT)
        code, output = self.finish(proc, paths)
        self.assertEqual(code, 130, output)
        self.assertIn(f"no checkpoint in {paths['ckpt']}: starting from step 0", output)
        self.assertRegex(output, r"lifeline-agent: SIGINT: stopped 2 ranks(?: \(\d killed after the grace period\))?, "
                                 r"after 0 restart\(s\); the newest checkpoint is step 29 of " + re.escape(paths["ckpt"]) +
                         r" \((memory|disk)\): a relaunch resumes from it")
        # A hang: where the stacks are, and why the timeout was what it was.
        proc, paths = self.start("hang", [], ["--hang-timeout", "3"], restarts=0,
                                 command=[sys.executable, TUTORIAL], env={"HANG_AT": "3", "HANG_SECONDS": "60"})
        code, output = self.finish(proc, paths)
        self.assertEqual(code, 3, output)  # a hang may be the machine's: a requeue may help
        self.assertRegex(output, r"hang \(ranks 1\): .*\(hang timeout 3\.0 s: the floor, --hang-timeout, which no "
                                 r"shorter timeout goes below; 10x the longest recent one is [\d.]+ m?s\)")
        m = re.search(r"hang: the ranks' Python stacks and last events are in (\S+)/ \(([^)]*)\)", output)
        self.assertIsNotNone(m, output)
        files = m.group(2).split(", ")
        self.assertTrue(any(f.startswith("stack.1.") for f in files), files)
        for f in files:
            self.assertTrue(os.path.getsize(os.path.join(m.group(1), f)) > 0, f)


if __name__ == "__main__":
    unittest.main()
