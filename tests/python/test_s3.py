"""Checkpoints in an S3 bucket, as a user meets them (issue 52), against a real SeaweedFS cluster this
test starts with tools/seaweedfs (its endpoint and credentials reach Lifeline through the standard
AWS variables, as a user's would): lifeline.Checkpointer on an s3:// directory (save, load into
another layout, list, latest, gc); dcp.save/dcp.load through lifeline.dcp on s3://; a 2-rank job
under lifeline-agent --checkpoint-dir s3://... with a rank SIGKILLed at a step, resumed from the
bucket, then loaded by one process and resharded by `lifeline reshard`; `lifeline ls`, `verify`,
`inspect`, `diff`, `convert` and `gc` on the s3:// path. Skipped, saying so, without a `weed` binary.
The store's faults met by a job: a 2-rank job under the agent that saves every step with the
memory tier trains on while tools/s3-fault-proxy in front of the gateway takes the bucket away, the
agent says the durable copy fell behind, and the later steps reach the bucket once it is back; a
request signed by a clock 20 minutes off (faketime) is refused at once, saying to check the clock.
"""
import json
import os
import shutil
import subprocess
import sys
import time
import unittest

import torch

import lifeline

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("LIFELINE_SOURCE") or os.path.dirname(os.path.dirname(HERE))
JOB = os.path.join(HERE, "s3_agent_job.py")
OUTAGE_JOB = os.path.join(HERE, "s3_outage_job.py")
PROXY = os.path.join(SOURCE, "tools", "s3-fault-proxy")
sys.path.insert(0, HERE)
import s3_agent_job  # noqa: E402
import s3_cluster  # noqa: E402
from torch_versions import needs_fsdp2  # noqa: E402


class ObjectStorage(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir, store = s3_cluster.start(cls)
        os.environ.update(store)  # as a user exports them: every process the tests start inherits them
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

        expected = s3_agent_job.trained(steps)  # the same steps, never interrupted
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

    def test_training_goes_on_from_the_memory_tier_while_the_bucket_is_away(self):
        d = self.url("outage")
        work = os.path.join(self.dir, "outage")
        os.makedirs(work)
        hold = os.path.join(work, "bucket-back")
        events = os.path.join(work, "events.jsonl")
        proxy = FaultProxy(os.environ["AWS_ENDPOINT_URL"])
        self.addCleanup(proxy.stop)
        # The job and the agent reach the bucket only through the proxy; this test, straight.
        env = dict(os.environ, AWS_ENDPOINT_URL=proxy.endpoint, LIFELINE_MEMORY_TIER_DIR=os.path.join(work, "tier"))
        steps, hold_at = 30, 22
        out = open(os.path.join(work, "job.out"), "w+")
        self.addCleanup(out.close)
        agent = subprocess.Popen(
            [self.agent, "run", "--nproc", "2", "--max-restarts", "0", "--master-port", "0",
             "--run-dir", os.path.join(work, "run"), "--events-log", events, "--checkpoint-dir", d, "--",
             sys.executable, OUTAGE_JOB, "--dir", d, "--steps", str(steps), "--progress", work,
             "--hold-at", str(hold_at), "--hold-file", hold],
            env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        self.addCleanup(_stop_agent, agent)

        def reached():
            return min(_read_int(os.path.join(work, f"rank{r}")) for r in range(2))

        def log():
            out.flush()
            out.seek(0)
            return out.read()[-4000:]

        _wait_for(lambda: reached() >= 4 or agent.poll() is not None, "the job's first steps", log)
        self.assertIsNone(agent.poll(), log())
        proxy.stop()  # the bucket is away: every connection refused
        went_away = reached()
        # Training goes on, from the memory tier: ten more steps, while no save can reach the bucket.
        _wait_for(lambda: reached() >= went_away + 10 or agent.poll() is not None, "steps while the bucket is away", log)
        self.assertIsNone(agent.poll(), log())
        while_away = reached()
        self.assertLess(while_away, hold_at, "the job outran the outage")
        durable = [c["step"] for c in lifeline.Checkpointer(d, rank=0, world_size=1, load_only=True).list()
                   if c["complete"]]
        self.assertLess(max(durable, default=0), while_away - 5, "the durable copy did not fall behind")
        proxy.start()  # the bucket is back, on the same port
        with open(hold, "w"):
            pass
        self.assertEqual(0, agent.wait(timeout=300), log())
        self.assertIn("done", log())

        # The agent said the durable copy fell behind, naming the ranks and a step of the outage.
        with open(events) as f:
            logged = f.read()
        anomalies = [e for e in map(json.loads, logged.splitlines()) if e.get("kind") == "checkpoint"]
        behind = [a for a in anomalies if "durable copy is behind" in a["message"]
                  and any(went_away <= s <= while_away for s in a["evidence"]["superseded_steps"])]
        self.assertTrue(behind, [a["message"] for a in anomalies] or logged[-4000:])
        for a in behind:
            self.assertTrue(a["ranks"] and set(a["ranks"]) <= {0, 1}, a)
            self.assertIn(str(a["step"]), a["message"])
            self.assertIn(a["step"], a["evidence"]["superseded_steps"])
        self.assertNotIn(os.environ["AWS_SECRET_ACCESS_KEY"], logged)
        # Every rank's saves of the outage went to the memory tier; the ones whose durable copy
        # never began carry the reason in their ticket; the last one is durable.
        for r in range(2):
            with open(os.path.join(work, f"tickets{r}.json")) as f:
                said = {int(k): v for k, v in json.load(f).items()}
            for step in range(went_away + 1, while_away + 1):
                self.assertTrue(said[step]["memory_tier"], (r, step, said[step]))
            superseded = [s for s, v in said.items() if v["error"] and "superseded" in v["error"]]
            self.assertTrue(superseded, (r, said))
            self.assertTrue(any(went_away <= s <= while_away for s in superseded), (r, superseded))
            self.assertIsNone(said[steps]["error"])

        # Once the bucket is back the later steps are durable: another process, another world
        # size, loads the last one from the bucket, and it is what the 30 steps computed.
        expected = s3_agent_job.trained(steps)
        one = lifeline.Checkpointer(d, rank=0, world_size=1)
        state = {"w": torch.zeros(s3_agent_job.ROWS, s3_agent_job.COLS), "step": 0}
        self.assertEqual(steps, one.load(state))
        self.assertFalse(one.last_load["from_memory_tier"])
        self.assertEqual(2, one.last_load["saved_world_size"])
        self.assertTrue(torch.equal(expected, state["w"]))
        one.close()
        self.cli("verify", d)

    def test_a_clock_far_off_is_refused_at_once_saying_to_check_it(self):
        if shutil.which("faketime") is None:
            self.skipTest("no faketime (Debian's faketime package; tools/setup installs it)")
        d = self.url("skewed")
        secret = os.environ["AWS_SECRET_ACCESS_KEY"]
        # S3 and SeaweedFS refuse a request dated more than 15 minutes from their clock.
        for offset in ("-20m", "+2h"):
            r = subprocess.run(["faketime", "-f", offset, self.lifeline, "ls", d], capture_output=True, text=True,
                               timeout=120)
            text = r.stdout + r.stderr
            self.assertNotEqual(0, r.returncode, text)
            self.assertIn("RequestTimeTooSkewed", text)
            self.assertIn("refused the request's time as skewed", text)
            self.assertIn("check this machine's clock", text)
            self.assertIn(os.environ["AWS_ENDPOINT_URL"], text)
            self.assertIn(f"s3://{self.bucket}", text)
            self.assertNotIn("gave up after", text)  # refused at once, not retried
            self.assertNotIn(secret, text)
        # A save by a process whose clock is off fails the same way, naming the object.
        script = ("import lifeline, torch\n"
                  f"c = lifeline.Checkpointer({d!r}, rank=0, world_size=1, run_id='skewed')\n"
                  "c.save(1, {'w': torch.ones(4)}).wait_committed(60)\n")
        r = subprocess.run(["faketime", "-f", "-20m", sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=300)
        text = r.stdout + r.stderr
        self.assertNotEqual(0, r.returncode, text)
        self.assertIn("check this machine's clock", text)
        self.assertIn(d + "/", text)
        self.assertNotIn("gave up after", text)
        self.assertNotIn(secret, text)
        self.assertEqual([], lifeline.Checkpointer(d, rank=0, world_size=1, load_only=True).list())
        # A wrong secret says so as plainly.
        r = subprocess.run([self.lifeline, "ls", d], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, AWS_SECRET_ACCESS_KEY="not-the-secret-0123456789"))
        text = r.stdout + r.stderr
        self.assertNotEqual(0, r.returncode, text)
        self.assertIn("SignatureDoesNotMatch", text)
        self.assertIn("the secret access key does not match access key ****", text)
        self.assertNotIn("not-the-secret-0123456789", text)
        self.assertNotIn(secret, text)


class FaultProxy:
    """tools/s3-fault-proxy forwarding untouched to `endpoint`; stop() takes it away (connections
    refused, those open reset), start() brings it back on the same port."""

    def __init__(self, endpoint):
        self.target = endpoint.split("://", 1)[1]
        self.port = 0
        self.process = None
        self.start()
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def start(self):
        self.process = subprocess.Popen([sys.executable, PROXY, "--target", self.target, "--port", str(self.port),
                                         "--owner-pid", str(os.getpid())], stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        if not line.startswith("port "):
            raise AssertionError(f"tools/s3-fault-proxy did not start: {line!r}")
        self.port = int(line.split()[1])

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
            self.process.stdout.close()


def _read_int(path):
    try:
        with open(path) as f:
            return int(f.read() or 0)
    except (OSError, ValueError):
        return 0


def _stop_agent(agent):
    """SIGTERM, as a scheduler stops a job: the agent stops its ranks (each in its own process
    group, which a SIGKILL of the agent alone would leave running), then SIGKILL if it lingers."""
    if agent.poll() is not None:
        return
    agent.terminate()
    try:
        agent.wait(timeout=30)
    except subprocess.TimeoutExpired:
        agent.kill()
        agent.wait()


def _wait_for(condition, what, log, seconds=180):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {seconds} s; the job said: {log()}")
        time.sleep(0.05)


if __name__ == "__main__":
    unittest.main()
