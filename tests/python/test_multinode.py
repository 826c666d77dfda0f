"""tools/train_gpt.py across two lifeline-agents over gloo, as two nodes meeting through a real etcd.

Each agent is a node of 2 ranks (its memory tier in its own LIFELINE_MEMORY_TIER_DIR); the world
is 4, tensor parallel within a node and data parallel across the two. A failure on one node makes gloo fail the ranks of the other node a moment later; the
events logs must name the rank that failed first, call the others' exits echoes, restart both
nodes in round 1, and end with a checkpoint bitwise equal to one agent's run of 4 ranks.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

SOURCE = os.environ.get("LIFELINE_SOURCE", os.path.join(os.path.dirname(__file__), "..", ".."))
TRAIN = os.path.join(SOURCE, "tools", "train_gpt.py")
STEPS = ["--steps", "30", "--ckpt-every", "5", "--quiet"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """Debian's etcd on loopback, on free ports, with a temporary data directory."""

    def __init__(self, directory):
        binary = shutil.which("etcd") or "/usr/bin/etcd"
        if not os.path.exists(binary):
            raise AssertionError("no etcd binary (Debian: etcd-server; tools/setup installs it)")
        # A free port may be taken by another test's process before etcd binds it (ctest runs
        # several at once): etcd then exits at once, and is started again on other ports.
        for attempt in range(3):
            client, peer = free_port(), free_port()
            self.endpoint = f"127.0.0.1:{client}"
            self.log = open(os.path.join(directory, "etcd.log"), "w")
            data = os.path.join(directory, "etcd")
            shutil.rmtree(data, ignore_errors=True)
            self.proc = subprocess.Popen(
                [binary, "--name", "test", "--data-dir", data,
                 "--listen-client-urls", f"http://{self.endpoint}", "--advertise-client-urls", f"http://{self.endpoint}",
                 "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls",
                 f"http://127.0.0.1:{peer}", "--initial-cluster", f"test=http://127.0.0.1:{peer}"],
                stdout=self.log, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    with socket.create_connection(("127.0.0.1", client), timeout=0.2):
                        return
                except OSError:
                    time.sleep(0.05)
            exited = self.proc.poll() is not None
            self.stop()
            if not exited:
                break
        with open(os.path.join(directory, "etcd.log")) as f:
            tail = f.read()[-2000:]
        raise AssertionError(f"etcd did not listen on {self.endpoint} within 30 s:\n{tail}")

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self.log.close()


def read_events(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class TrainGptAcrossAgents(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        base = os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp")
        cls.dir = tempfile.mkdtemp(prefix="lifeline-pymultinode-", dir=base)
        cls.etcd = Etcd(cls.dir)
        cls.agent = os.path.join(os.environ["LIFELINE_BIN"], "lifeline-agent")
        # The reference: one agent, 4 ranks, no fault.
        single = os.path.join(cls.dir, "single")
        r = subprocess.run([cls.agent, "run", "--nproc", "4", "--master-port", "0", "--",
                            sys.executable, TRAIN, "--dir", single] + STEPS,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        cls.single = single

    @classmethod
    def tearDownClass(cls):
        cls.etcd.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def run_two_nodes(self, name, fault):
        ckpt = os.path.join(self.dir, name)
        procs = []
        for node in range(2):
            env = dict(os.environ, LIFELINE_MEMORY_TIER_DIR=os.path.join(self.dir, f"{name}.tier{node}"))
            cmd = [self.agent, "run", "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint",
                   self.etcd.endpoint, "--rdzv-id", name, "--node-rank", str(node), "--max-restarts", "2",
                   "--events-log", os.path.join(self.dir, f"{name}.{node}.events"), "--checkpoint-dir", ckpt,
                   "--", sys.executable, TRAIN, "--dir", ckpt, "--fault", fault] + STEPS
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outputs = [p.communicate(timeout=300)[0] for p in procs]
        for node, p in enumerate(procs):
            self.assertEqual(p.returncode, 0, f"node {node}:\n{outputs[node]}")
        events = [read_events(os.path.join(self.dir, f"{name}.{node}.events")) for node in range(2)]
        compare = subprocess.run([sys.executable, TRAIN, "--compare", self.single, ckpt],
                                 capture_output=True, text=True, timeout=120)
        self.assertEqual(compare.returncode, 0, compare.stdout + compare.stderr)
        self.assertIn("bitwise identical", compare.stdout)
        for node in range(2):
            rounds = [e["round"] for e in events[node] if e.get("action") == "rendezvous"]
            self.assertEqual(rounds, [0, 1], f"node {node}: {events[node]}")
        return events

    def check_named_once(self, events, culprit_node, rank, echo_node):
        anomalies = [e for node in events for e in node if "kind" in e]
        self.assertEqual(len(anomalies), 1, anomalies)
        self.assertEqual(anomalies[0]["kind"], "dead")
        self.assertEqual(anomalies[0]["ranks"], [rank], anomalies[0])
        self.assertIn(anomalies[0], events[culprit_node])
        # The other node's ranks, failed by gloo when the culprit's connections closed, are echoes
        # (or were stopped before they noticed): never an anomaly of their own.
        for e in events[echo_node]:
            if e.get("action") == "echo":
                self.assertNotIn(rank, e["ranks"], e)

    def test_an_exception_on_node_0_is_named_there_and_node_1s_exits_are_echoes(self):
        events = self.run_two_nodes("raise", "raise@1:17")
        self.check_named_once(events, 0, 1, 1)

    def test_a_rank_killed_on_node_1_is_named_there_and_node_0s_exits_are_echoes(self):
        events = self.run_two_nodes("kill", "kill@3:17")
        self.check_named_once(events, 1, 3, 0)


class ThreadsWhateverTheLayout(unittest.TestCase):
    """A job of 2 ranks gets OMP_NUM_THREADS=1 on 1 node x 2 ranks and on 2 nodes x 1 rank alike
    (torchrun sets it only for a node of several ranks): CPU kernels sum in an order that depends
    on the thread count, so the two layouts would otherwise compute differently."""

    SHOW = [sys.executable, "-c", "import os; print('omp=%s' % os.environ.get('OMP_NUM_THREADS'))"]

    def test_one_node_of_two_and_two_nodes_of_one_get_one_thread_each(self):
        base = os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp")
        directory = tempfile.mkdtemp(prefix="lifeline-omp-", dir=base)
        self.addCleanup(shutil.rmtree, directory, ignore_errors=True)
        agent = os.path.join(os.environ["LIFELINE_BIN"], "lifeline-agent")
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        one = subprocess.run([agent, "run", "--nproc", "2", "--master-port", "0", "--"] + self.SHOW, env=env,
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(one.returncode, 0, one.stdout + one.stderr)
        etcd = Etcd(directory)
        self.addCleanup(etcd.stop)
        procs = [subprocess.Popen([agent, "run", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint",
                                   etcd.endpoint, "--rdzv-id", "omp", "--node-rank", str(node), "--"] + self.SHOW,
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for node in (0, 1)]
        two = [p.communicate(timeout=120)[0] for p in procs]
        for node, p in enumerate(procs):
            self.assertEqual(p.returncode, 0, f"node {node}:\n{two[node]}")
        self.assertIn("[rank 0] omp=1", one.stdout + one.stderr)
        self.assertIn("[rank 1] omp=1", one.stdout + one.stderr)
        self.assertIn("[rank 0] omp=1", two[0])
        self.assertIn("[rank 1] omp=1", two[1])


if __name__ == "__main__":
    unittest.main()
