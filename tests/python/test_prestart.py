"""Relaunched ranks start in spare interpreters the agent started ahead (agent/prestart.h,
lib/python/lifeline_startup/_lifeline_prestart.py).

A 2-rank gloo job under lifeline-agent: its first launch has rank 1 exit with status 1, its second
has rank 1 hang in the middle of the job, its third finishes. Each relaunch runs in the spares the
agent started while the launch before trained: torch is imported before the script begins, the
script runs as `python SCRIPT ARGS` under the new launch's environment (its rank, its new master
port, no trace of the spare's), the hang in a spare is named by its rank within the timeout (the
spare is traced as any rank), and the job ends as a plain one would. Spares that die before they
are needed are said once and the relaunch starts fresh processes.
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

PYTHON = sys.executable
AGENT = os.path.join(os.environ["LIFELINE_BIN"], "lifeline-agent")
HANG_TIMEOUT = 5.0

SCRIPT = textwrap.dedent('''
    import sys
    preloaded = "torch" in sys.modules      # before the script's own imports: a spare's doing
    import json, os, time
    import torch
    import torch.distributed as dist

    def main():
        events = sys.argv[sys.argv.index("--events") + 1]
        restart = int(os.environ["LIFELINE_RESTART"])
        rank = int(os.environ["RANK"])
        dist.init_process_group("gloo")
        print("START " + json.dumps({"rank": rank, "restart": restart, "preloaded": preloaded,
                                     "name": __name__, "argv": sys.argv[1:], "path0": sys.path[0],
                                     "port": os.environ["MASTER_PORT"], "pid": os.getpid(),
                                     "spare_env": os.environ.get("LIFELINE_PRESTART")}), flush=True)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        step = 0
        while step < 400:
            loss = model(torch.ones(2, 4)).sum()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step()
            opt.zero_grad()
            step += 1
            # Each launch waits for the spares the agent starts for the next one, then fails.
            if rank == 1 and restart < 2 and step > 5 and spares_started(events, restart):
                if restart == 0:
                    os._exit(1)
                time.sleep(600)  # hangs outside any collective: rank 0 waits in the next all_reduce
            time.sleep(0.02)
        print(f"DONE rank {rank} restart {restart}", flush=True)

    def spares_started(events, restart):
        """The agent has logged spares for the launch after this one."""
        prestarts, launches = 0, 0
        with open(events) as f:
            for line in f:
                e = json.loads(line)
                launches += e.get("action") == "launch"
                prestarts += e.get("action") == "prestart" and launches == restart + 1
        if "--kill-spares" in sys.argv and prestarts:
            kill_spares(events)
        return prestarts > 0

    def kill_spares(events):
        with open(events) as f:
            for line in f:
                e = json.loads(line)
                if e.get("action") == "prestart":
                    for pid in e["pids"]:
                        try:
                            os.kill(pid, 9)
                        except ProcessLookupError:
                            pass
        time.sleep(0.5)

    if __name__ == "__main__":
        main()
''')


class Prestart(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="lifeline-prestart-", dir=os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp"))
        self.script = os.path.join(self.dir, "job", "train.py")
        os.makedirs(os.path.dirname(self.script))
        with open(self.script, "w") as f:
            f.write(SCRIPT)
        self.events = os.path.join(self.dir, "events.jsonl")
        self.config = os.path.join(self.dir, "agent.yaml")
        with open(self.config, "w") as f:
            # Spares at once (the default waits 10 s into a launch), and no anomaly from two ranks
            # sharing two busy cores with the spares and the other tests (what is tested here is
            # where the relaunched ranks run).
            f.write("restart: {prestart_after_seconds: 0}\n"
                    "straggler: {min_lateness_seconds: 1.0}\nslow_collective: {min_excess_seconds: 1.0}\n")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def run_agent(self, *flags, script_args=()):
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)  # the agent makes lifeline importable itself
        cmd = [AGENT, "run", "--nproc", "2", "--master-port", "0", "--hang-timeout", str(HANG_TIMEOUT),
               "--max-restarts", "2", "--events-log", self.events, "--config", self.config, *flags, "--",
               PYTHON, self.script, "--events", self.events, *script_args]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=self.dir)
        with open(self.events) as f:
            log = [json.loads(l) for l in f if l.strip()]
        starts = [json.loads(l.split("START ", 1)[1]) for l in p.stdout.splitlines() if "START " in l]
        return p.returncode, p.stdout + p.stderr, log, starts

    def test_relaunched_ranks_run_in_spares_under_their_own_launch_and_are_traced(self):
        rc, out, log, starts = self.run_agent()
        self.assertEqual(rc, 0, out)
        launches = [e for e in log if e.get("action") == "launch"]
        self.assertEqual([e.get("prestarted") for e in launches], [0, 2, 2], out)
        # The spares the agent started are the relaunched ranks' processes.
        prestarts = [e for e in log if e.get("action") == "prestart"]
        self.assertEqual(len(prestarts), 2, log)
        for spares, launch in zip(prestarts, launches[1:]):
            self.assertEqual(sorted(spares["pids"]), sorted(launch["pids"]), log)
        # Faults named as in any launch: rank 1's exit, then rank 1's hang within the timeout + 2 s.
        anomalies = [e for e in log if "kind" in e]
        self.assertEqual([(a["kind"], a["ranks"]) for a in anomalies], [("dead", [1]), ("hang", [1])], anomalies)
        by_launch = {}
        for s in starts:
            by_launch.setdefault(s["restart"], {})[s["rank"]] = s
        self.assertEqual(sorted(by_launch), [0, 1, 2], starts)
        for restart, ranks in by_launch.items():
            self.assertEqual(sorted(ranks), [0, 1], starts)
            for rank, s in ranks.items():
                self.assertEqual(s["preloaded"], restart > 0, s)  # torch imported ahead in the spares only
                self.assertEqual(s["name"], "__main__", s)
                self.assertEqual(s["argv"], ["--events", self.events], s)
                self.assertEqual(s["path0"], os.path.dirname(self.script), s)
                self.assertIsNone(s["spare_env"], s)
                self.assertEqual(s["port"], by_launch[restart][0]["port"], s)
        ports = [by_launch[r][0]["port"] for r in (0, 1, 2)]
        self.assertEqual(len(set(ports)), 3, f"each launch has its own master port: {ports}")
        self.assertIn("DONE rank 0 restart 2", out)
        self.assertIn("DONE rank 1 restart 2", out)
        self.assertNotIn("prestart_off", json.dumps(log))

    def test_spares_that_died_leave_the_relaunch_to_fresh_processes(self):
        rc, out, log, starts = self.run_agent(script_args=("--kill-spares",))
        self.assertEqual(rc, 0, out)
        launches = [e for e in log if e.get("action") == "launch"]
        self.assertEqual(launches[1].get("prestarted"), 0, log)
        off = [e for e in log if e.get("action") == "prestart_off"]
        self.assertEqual(len(off), 1, log)
        self.assertIn("killed by SIGKILL", off[0]["reason"])
        self.assertIn("relaunched ranks start afresh", out)
        relaunched = [s for s in starts if s["restart"] == 1]
        self.assertEqual(sorted(s["rank"] for s in relaunched), [0, 1], starts)
        self.assertFalse(any(s["preloaded"] for s in relaunched), starts)
        # No spares for it, so the second launch's rank 1 has nothing to wait for: it finishes.
        self.assertEqual([e.get("prestarted") for e in launches], [0, 0], log)
        self.assertIn("DONE rank 1 restart 1", out)


if __name__ == "__main__":
    unittest.main()
