"""A rollback in a multi-node job (issue 53, item 4): two lifeline-agents meeting through a real etcd.

The job of tests/python/test_rollback.py (gloo DDP, a checkpoint every 5 steps, a step's data a
function of the step alone) runs as 2 nodes of 1 rank, each node with its own memory tier. On the
first launch rank 1 (node 1) computes a NaN loss at step 25; the NaN reaches rank 0 through the
all-reduce. The agent that decides the rollback moves the job to a round that carries it: both
nodes must resume from step 20 (the newest checkpoint before the fault, in both nodes' reach),
tell their ranks the same steps to skip (rollback.skip_data: always), and the job must finish with
the replicas equal and finite.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_multinode import Etcd, read_events  # noqa: E402
from test_rollback import SCRIPT  # noqa: E402


class RollbackAcrossNodes(unittest.TestCase):
    def setUp(self):
        base = os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp")
        self.dir = tempfile.mkdtemp(prefix="lifeline-mnrollback-", dir=base)
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.etcd = Etcd(self.dir)
        self.addCleanup(self.etcd.stop)

    def test_a_nan_on_one_node_rolls_the_whole_job_back_to_one_step_and_it_finishes(self):
        agent = os.path.join(os.environ["LIFELINE_BIN"], "lifeline-agent")
        script = os.path.join(self.dir, "rank.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        config = os.path.join(self.dir, "agent.yaml")
        with open(config, "w") as f:
            f.write("rollback:\n  skip_data: always\n")
        ckpt = os.path.join(self.dir, "ckpt")
        procs = []
        for node in range(2):
            env = dict(os.environ, LIFELINE_MEMORY_TIER_DIR=os.path.join(self.dir, f"tier{node}"))
            cmd = [agent, "run", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", self.etcd.endpoint,
                   "--rdzv-id", "mnrollback", "--node-rank", str(node), "--node-name", f"node{node}",
                   "--max-restarts", "2", "--config", config,
                   "--events-log", os.path.join(self.dir, f"events.{node}"), "--checkpoint-dir", ckpt,
                   "--", sys.executable, script, self.dir, "nan"]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outputs = [p.communicate(timeout=600)[0] for p in procs]
        for node, p in enumerate(procs):
            self.assertEqual(p.returncode, 0, f"node {node}:\n{outputs[node]}")
        events = [read_events(os.path.join(self.dir, f"events.{node}")) for node in range(2)]
        everything = events[0] + events[1]

        # The fault was named, and a rollback decided (by one node, or by both at once: one round).
        self.assertTrue([e for e in everything if e.get("kind") == "non_finite"], outputs)
        decided = [e for e in everything if e.get("action") == "rollback"]
        # One decision: node 1's (its rank's own loss went NaN); a value the all-reduce spread to
        # node 0 is left to it (an "echo" there, when node 0 saw it before the round moved).
        self.assertEqual(len(decided), 1, decided)
        self.assertTrue([e for e in events[1] if e.get("action") == "rollback"], events[1])
        for d in decided:
            self.assertEqual((d["anomaly"], d["checkpoint"]), ("non_finite", 20), d)
            self.assertEqual(d["round_resumes_before"], 21, d)
            self.assertNotIn("not_acted_on", d)
        # Both nodes joined round 1, a rollback's round, and resumed from the same step with the
        # same steps skipped.
        rounds = [[e for e in node_events if e.get("action") == "rollback_round"] for node_events in events]
        for node in range(2):
            self.assertEqual(len(rounds[node]), 1, f"node {node}: {events[node]}")
            self.assertEqual(rounds[node][0]["round"], 1)
            self.assertEqual(rounds[node][0]["step"], 20)
            self.assertEqual([e["round"] for e in events[node] if e.get("action") == "rendezvous"], [0, 1])
        self.assertEqual(rounds[0][0]["skip_steps"], rounds[1][0]["skip_steps"])
        self.assertTrue(rounds[0][0]["skip_steps"].startswith("21-"), rounds[0][0])
        launches = [[e for e in node_events if e.get("action") == "launch"] for node_events in events]
        for node in range(2):
            self.assertEqual(len(launches[node]), 2, events[node])
            resume = launches[node][1]["resume"]
            self.assertEqual((resume["step"], resume.get("rollback")), (20, True), resume)
            self.assertEqual(resume["skip_steps"], rounds[0][0]["skip_steps"], resume)

        results = []
        for rank in range(2):
            with open(os.path.join(self.dir, f"result.1.{rank}.json")) as f:
                results.append(json.load(f))
        for r in results:
            self.assertEqual(r["loaded"], 20, r)
            self.assertTrue(r["finite"], r)
            self.assertTrue(r["skipped"], r)
            self.assertEqual(r["skipped"][0], 21, r)
        self.assertEqual(results[0]["skipped"], results[1]["skipped"])  # the same data on every node
        self.assertEqual(results[0]["digest"], results[1]["digest"])  # the replicas agree
        # No checkpoint at or after the fault survived from the first launch: the steps after 20
        # were removed from the shared directory and from both memory tiers, and saved again.
        self.assertTrue(os.path.isdir(os.path.join(ckpt, "step-%020d" % 35)))

    def three_nodes(self, job, script_text, flags, args, **env):
        """Runs `script_text` as 3 agents of 1 rank each (node0..node2, each its own memory tier) until
        they end; asserts each ended 0; returns each node's events and output."""
        agent = os.path.join(os.environ["LIFELINE_BIN"], "lifeline-agent")
        script = os.path.join(self.dir, f"{job}.py")
        with open(script, "w") as f:
            f.write(script_text)
        procs = []
        for node in range(3):
            node_env = dict(os.environ, LIFELINE_MEMORY_TIER_DIR=os.path.join(self.dir, f"tier{node}"), **env)
            cmd = [agent, "run", "--nnodes", "3", "--nproc-per-node", "1", "--rdzv-endpoint", self.etcd.endpoint,
                   "--rdzv-id", job, "--node-rank", str(node), "--node-name", f"node{node}",
                   "--events-log", os.path.join(self.dir, f"events.{node}"), *flags, "--", sys.executable, script,
                   *args]
            procs.append(subprocess.Popen(cmd, env=node_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        outputs = [p.communicate(timeout=600)[0] for p in procs]
        for node, p in enumerate(procs):
            self.assertEqual(p.returncode, 0, f"node {node}:\n{outputs[node]}")
        return [read_events(os.path.join(self.dir, f"events.{node}")) for node in range(3)], outputs

    def test_a_flipped_bit_on_a_replica_whose_peers_are_all_on_other_nodes_is_named_by_the_leader(self):
        """3 nodes of 1 rank, gloo DDP (tests/python/test_sdc.py's job): every replica of every
        parameter is on another node, so no node alone can compare anything (TP 8 at scale). After
        step 4's update one bit of rank 2's copy of a weight is flipped: the leader must name rank 2
        and its node from the nodes' folds of the step-4 snapshot, ask node 2 which tensor, roll the
        job back to step 2 (never to the suspect step) and the job must finish."""
        from test_sdc import SCRIPT as SDC_SCRIPT
        events, outputs = self.three_nodes("mnsdc", SDC_SCRIPT, ["--max-restarts", "2", "--checkpoint-dir",
                                                                 os.path.join(self.dir, "ckpt")],
                                           [self.dir, "flip"], SDC_STEP_SECONDS="3")
        everything = events[0] + events[1] + events[2]
        sdc = [e for e in everything if e.get("kind") == "sdc_suspect"]
        self.assertTrue(sdc, outputs)
        first = sdc[0]
        self.assertEqual((first["step"], first["ranks"]), (4, [2]), first)
        self.assertEqual(first["evidence"]["compared_by"], "leader", first)
        self.assertEqual(first["evidence"]["nodes"], {"2": "node2"}, first)
        self.assertEqual(first["evidence"]["ranks_compared"], [0, 1, 2], first)
        self.assertNotIn("details_missing", first["evidence"], first)
        tensor = first["evidence"]["tensors"][0]
        self.assertIn("0.weight", tensor["tensor"], tensor)
        self.assertEqual(tensor["byte_range"], [0, 32 * 16 * 4], tensor)
        self.assertEqual(tensor["ranks"], [2], tensor)
        # Only the leader judged (one verdict per step), and it asked which tensors.
        self.assertEqual(len({e["step"] for e in sdc}), len(sdc), sdc)
        self.assertTrue([e for e in everything if e.get("action") == "digest_query" and e.get("ok")], everything)
        decided = [e for e in everything if e.get("action") == "rollback"]
        self.assertEqual(len(decided), 1, decided)
        self.assertEqual((decided[0]["anomaly"], decided[0]["anomaly_step"], decided[0]["checkpoint"]),
                         ("sdc_suspect", 4, 2), decided[0])
        self.assertEqual(decided[0]["nodes"], ["node2"], decided[0])
        for node in range(3):
            launches = [e for e in events[node] if e.get("action") == "launch"]
            self.assertEqual(len(launches), 2, events[node])
            self.assertEqual(launches[1]["resume"]["step"], 2, launches[1])
        for rank in range(3):
            with open(os.path.join(self.dir, f"loaded.1.{rank}")) as f:
                self.assertEqual(f.read(), "2")
        # The relaunch, with no flip, saved sound replicas: nothing after it is suspect.
        self.assertFalse([e for e in sdc if e.get("restart", 0) != 0 and e.get("round", 0) != 0], sdc)

    def test_a_norm_that_differs_on_a_node_holding_no_other_replica_is_named_by_the_leader(self):
        """3 nodes of 1 rank report the global gradient norm each step (identical by construction);
        rank 2's differs in its last bit at step 12. No node holds two members of the group: the
        leader compares the nodes' values and names rank 2, once."""
        events, outputs = self.three_nodes("mnnorm", NORM_SCRIPT, [], [])
        everything = sum(events, [])
        found = [e for e in everything if e.get("kind") == "disagreement"]
        self.assertEqual(len(found), 1, (found, outputs))
        self.assertEqual((found[0]["step"], found[0]["ranks"]), (12, [2]), found[0])
        self.assertEqual(found[0]["evidence"]["compared_by"], "leader", found[0])
        self.assertEqual(found[0]["evidence"]["ranks_compared"], 3, found[0])


NORM_SCRIPT = """
import os, time
import lifeline
rank = int(os.environ["RANK"])
for step in range(1, 56):
    with lifeline.trace.step(step):
        norm = 2.0 + 0.01 * step
        if rank == 2 and step == 12:
            norm += 2 ** -40  # a low bit off: a silent fault of one replica
        lifeline.report(grad_norm=norm, step=step)
        if step >= 10:
            time.sleep(0.2)  # the leader's verdict comes seconds after step 12, before the job ends
"""


if __name__ == "__main__":
    unittest.main()
