"""torchtitan's trainer checkpointing through Lifeline (lifeline.torchtitan, issue 33), under
lifeline-agent.

torchtitan's llama3 debug model trains on CPU over gloo, run as `python -m torchtitan.train
--module llama3 --config llama3_debugmodel ...` with torchtitan's own arguments, a tokenizer and a
small text dataset made here (torchtitan's test assets are not in its wheel). torchtitan 0.3.0
cannot train on CPU as it comes: tests/python/titan_train.py says what stops it, file and line,
and makes the device choice "cpu" (and bridges three gaps between torchtitan 0.3.0 and torch
2.13's CPU wheel over gloo), and
tests/python/titan_cpu_attention.py, a torchtitan override, computes its FlexAttention eagerly
(FlexAttention has no backward on CPU). The trainer, FSDP2, optimizer, lr scheduler, dataloader and
checkpoint manager interface are torchtitan's own.

Lifeline is picked by torchtitan's config: `--override.imports
lifeline.torchtitan.checkpoint_with_lifeline` on the command line, or a config function's
`checkpoint=LifelineCheckpointManager.Config(...)` (tests/python/titan_config.py).

- 2 FSDP ranks, checkpoints every 2 steps, async: rank 1 is SIGKILLed in the forward of step 6,
  once step 4 is durable; the agent relaunches both, they resume from step 4 (the step the agent fixed), and
  step 5, run before the kill and again after it, gives the same loss and the same parameters
  (model, optimizer, lr schedule and the dataloader's position all restored) on both ranks, bit
  for bit. `lifeline verify` and `lifeline ls` accept the checkpoint folder, which holds no DCP
  files, only Lifeline's.
- 1 rank, synchronous saves, Lifeline options from the config: lifeline.Checkpointer.load reads the
  last step's model state exactly as the trainer held it, and its train state.
- torchtitan's pipeline parallelism, 2 stages x 2 FSDP ranks (each stage's DTensors on its own dp
  slice), async saves: a rank of the last stage killed after a save, all 4 resume bit for bit, and
  every tensor is stored once.

Needs torchtitan 0.3 (tools/requirements.txt, in .venv): under .venv its absence fails the test;
under another Python (Debian's, torch 1.13 or 2.6, no torchtitan) the test skips, saying why.
"""
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import s3_cluster  # noqa: E402
BIN = os.environ.get("LIFELINE_BIN", os.path.join(HERE, "..", "..", "build", "bin"))


def _torchtitan_missing():
    if importlib.util.find_spec("torchtitan") is None:
        return "torchtitan is not installed"
    version = importlib.metadata.version("torchtitan")
    if not version.startswith("0.3."):
        return f"torchtitan {version} is installed; lifeline.torchtitan is for 0.3"
    return None


NO_TORCHTITAN = _torchtitan_missing()
# The repository's .venv (torch 2.13 with tools/requirements.txt) must have torchtitan.
TORCHTITAN_REQUIRED = sys.prefix.rstrip("/").endswith(".venv") or \
    tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2]) >= (2, 13)

STEPS = 8
KILL_AT = 6
INTERVAL = 2
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def make_assets(root):
    """A word-level tokenizer (tokenizer.json, tokenizer_config.json) under the debug model's
    vocabulary of 2048, and a dataset of 200 documents of its words, as torchtitan's `c4_test`
    dataset directory is laid out (JSON lines with a "text" field)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    words = [f"w{i}" for i in range(1000)]
    vocab = {"<unk>": 0, BOS: 1, EOS: 2}
    vocab.update({w: i + 3 for i, w in enumerate(words)})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens([BOS, EOS])
    tok_dir = os.path.join(root, "tokenizer")
    os.makedirs(tok_dir)
    tokenizer.save(os.path.join(tok_dir, "tokenizer.json"))
    with open(os.path.join(tok_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": BOS, "eos_token": EOS}, f)
    data_dir = os.path.join(root, "c4_test")
    os.makedirs(data_dir)
    rng = random.Random(33)
    with open(os.path.join(data_dir, "c4_small.json"), "w") as f:
        for _ in range(200):
            # Zipf-like: some words far more frequent than others, so the loss falls.
            text = " ".join(words[min(int(rng.paretovariate(1.2)) - 1, 999)] for _ in range(rng.randint(40, 160)))
            f.write(json.dumps({"text": text}) + "\n")
    return tok_dir, data_dir


def run_under_agent(root, tok_dir, data_dir, config, extra_args=(), nproc=2, env=None, steps=STEPS,
                    ckpt_dir=None):
    """torchtitan's debug model trained for `steps` steps under lifeline-agent, with checkpoints in
    the agent's checkpoint directory (torchtitan's default folder under its dump folder, or
    `ckpt_dir`, which torchtitan's checkpoint.folder then names); returns (exit status, output,
    agent events, that directory)."""
    dump = os.path.join(root, "outputs")
    if ckpt_dir is None:
        ckpt_dir = os.path.join(dump, "checkpoint")
    else:
        extra_args = ["--checkpoint.folder", ckpt_dir] + list(extra_args)
    events = os.path.join(root, "events.jsonl")
    titan_args = [
        "--module", config[0], "--config", config[1],
        "--hf_assets_path", tok_dir, "--dump_folder", dump,
        "--dataloader.dataset", "c4_test", "--dataloader.dataset_path", data_dir,
        "--training.steps", str(steps), "--training.seq_len", "64", "--training.local_batch_size", "2",
        "--debug.seed", "7", "--parallelism.spmd_backend", "partial_dtensor",
    ] + list(extra_args)
    cmd = [os.path.join(BIN, "lifeline-agent"), "run", "--nproc", str(nproc), "--master-port", "0",
           "--checkpoint-dir", ckpt_dir,
           "--events-log", events, "--max-restarts", "1", "--",
           sys.executable, os.path.join(HERE, "titan_train.py")] + titan_args
    env = dict(os.environ, HF_HOME=os.path.join(root, "hf"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", **(env or {}))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    log = []
    if os.path.exists(events):
        with open(events) as f:
            log = [json.loads(line) for line in f if line.strip()]
    return p.returncode, p.stdout + p.stderr, log, ckpt_dir


def steps_printed(out):
    """{(rank, step): [(loss, parameter digest), ...]} in the order titan_train.py printed them."""
    runs = {}
    for rank, step, loss, params in re.findall(r"TITAN rank (\d) step (\d+) loss (\S+) params (\S+)", out):
        runs.setdefault((int(rank), int(step)), []).append((loss, params))
    return runs


def killed_and_resumed(test, root, ckpt_dir=None, env=None):
    """2 FSDP ranks, async saves every 2 steps into `ckpt_dir` (None: torchtitan's folder under its
    dump folder), rank 1 killed at step 6 once step 4 is durable: the relaunch resumes from step 4
    and redoes step 5 bit for bit; the folder holds Lifeline's checkpoint and nothing of DCP's."""
    tok_dir, data_dir = make_assets(root)
    rc, out, log, ckpt_dir = run_under_agent(
        root, tok_dir, data_dir, ("llama3", "llama3_debugmodel"),
        ["--checkpoint.enable", "--checkpoint.interval", str(INTERVAL), "--checkpoint.async_mode", "async",
         "--checkpoint.keep_latest_k", "3",
         "--override.imports", "lifeline.torchtitan.checkpoint_with_lifeline",
         "titan_cpu_attention.eager_cpu_attention"],
        env=dict(env or {}, TITAN_KILL_AT=str(KILL_AT), TITAN_KILL_RANK="1", TITAN_KILL_AFTER_SAVE="1"),
        ckpt_dir=ckpt_dir)
    test.assertEqual(rc, 0, out)
    # torchtitan's config picked Lifeline's manager.
    test.assertRegex(out, r"\[Override\] lifeline\.torchtitan\.checkpoint_with_lifeline: checkpoint "
                          r"CheckpointManager\.Config -> LifelineCheckpointManager\.Config")
    test.assertIn(f"TITAN rank 1 killed at step {KILL_AT}", out)

    dead = [e for e in log if e.get("kind") == "dead"]
    test.assertEqual(len(dead), 1, out)
    test.assertEqual(dead[0]["ranks"], [1], out)
    launches = [e for e in log if e.get("action") == "launch"]
    test.assertEqual(len(launches), 2, out)
    resume = KILL_AT - INTERVAL  # the newest checkpoint, made durable before the kill
    test.assertEqual(launches[1]["resume"]["step"], resume, out)
    test.assertEqual(len(re.findall(rf"Loaded step {resume} of Lifeline checkpoint", out)), 2, out)
    test.assertEqual(len(re.findall(rf"Training starts at step {resume + 1}", out)), 2, out)
    # The agent saw the relaunch resume from that step, stepping on at the next (torchtitan's
    # first save and its load make DCP step the optimizer once with lr 0: not a step).
    resumed = [e for e in log if e.get("action") == "resumed"]
    test.assertEqual(len(resumed), 1, out)
    test.assertEqual((resumed[0]["resumed_from_checkpoint"], resumed[0]["step"]), (resume, resume + 1), out)

    # Every step's loss and parameters, per rank, in the order printed: steps after the
    # checkpoint and before the kill ran twice, and must not differ by a bit.
    runs = steps_printed(out)
    for rank in (0, 1):
        test.assertEqual(sorted(s for r, s in runs if r == rank), list(range(1, STEPS + 1)), out)
        for step in range(1, STEPS + 1):
            seen = runs[(rank, step)]
            test.assertEqual(len(seen), 2 if resume < step < KILL_AT else 1, (rank, step, seen))
            test.assertNotEqual(seen[0][0], "None", out)
            test.assertEqual(len(set(seen)), 1, f"rank {rank} step {step} differs after the resume: {seen}")
    # Not a trivial equality: training moved the parameters and the loss.
    test.assertNotEqual(runs[(0, 1)][0][1], runs[(0, STEPS)][0][1])
    test.assertLess(float.fromhex(runs[(0, STEPS)][0][0]), float.fromhex(runs[(0, 1)][0][0]))

    # The folder is a Lifeline checkpoint directory (no DCP files), readable by the CLI (in a
    # bucket, the listing below is what there is to see).
    for _dirpath, _dirs, files in os.walk(ckpt_dir):
        test.assertNotIn(".metadata", files)
    ls = subprocess.run([os.path.join(BIN, "lifeline"), "ls", ckpt_dir], capture_output=True, text=True)
    test.assertEqual(ls.returncode, 0, ls.stdout + ls.stderr)
    for step in (4, 6, 8):  # keep_latest_k 3
        test.assertRegex(ls.stdout, rf"(?m)^\s*{step}\b", ls.stdout)
    test.assertNotRegex(ls.stdout, r"(?m)^\s*2\b", ls.stdout)
    verify = subprocess.run([os.path.join(BIN, "lifeline"), "verify", ckpt_dir], capture_output=True, text=True)
    test.assertEqual(verify.returncode, 0, verify.stdout + verify.stderr)


class TorchtitanUnderAgent(unittest.TestCase):
    def setUp(self):
        if NO_TORCHTITAN:
            if TORCHTITAN_REQUIRED:
                self.fail(f"{NO_TORCHTITAN} in {sys.prefix}: tools/requirements.txt pins it (tools/setup installs it)")
            self.skipTest(f"{NO_TORCHTITAN} for {sys.executable} (torch {torch.__version__}): torchtitan 0.3 "
                          f"is tested in .venv")
        self.tmp = tempfile.mkdtemp(prefix="lifeline-titan-", dir=os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp"))

    def tearDown(self):
        if hasattr(self, "tmp"):
            shutil.rmtree(self.tmp, ignore_errors=True)

    def test_killed_rank_resumes_from_lifeline_checkpoint_with_equal_state(self):
        killed_and_resumed(self, self.tmp)

    def test_pipeline_stages_killed_and_resumed_with_equal_state(self):
        """torchtitan's pipeline parallelism on 4 ranks: 2 stages (1F1B, 2 microbatches), each
        stage's layers fully sharded on its own dp slice of the (pp, dp) mesh, so its DTensors are
        on 2 of the 4 ranks. Async saves every 2 steps, staged by lifeline.dcp (which agrees which
        ranks hold each name); rank 3, of the last stage, is SIGKILLed in the forward of step 4 once
        step 2 is durable; all 4 resume from step 2, and step 3, run before the kill and again
        after it, gives the same loss and parameters on every rank, bit for bit. Every tensor of
        the checkpoint is stored once."""
        steps, kill_at = 6, 4
        tok_dir, data_dir = make_assets(self.tmp)
        rc, out, log, ckpt_dir = run_under_agent(
            self.tmp, tok_dir, data_dir, ("llama3", "llama3_debugmodel"),
            ["--parallelism.pipeline_parallel_degree", "2", "--parallelism.data_parallel_shard_degree", "2",
             "--training.disable_cuda_graphs",  # torchtitan refuses CUDA graphs with pipeline parallelism
             "--checkpoint.enable", "--checkpoint.interval", str(INTERVAL), "--checkpoint.async_mode", "async",
             "--override.imports", "lifeline.torchtitan.checkpoint_with_lifeline",
             "titan_cpu_attention.eager_cpu_attention"],
            nproc=4, steps=steps,
            env={"TITAN_KILL_AT": str(kill_at), "TITAN_KILL_RANK": "3", "TITAN_KILL_AFTER_SAVE": "1"})
        self.assertEqual(rc, 0, out)
        self.assertIn(f"TITAN rank 3 killed at step {kill_at}", out)
        resume = kill_at - INTERVAL
        self.assertEqual(len(re.findall(rf"Loaded step {resume} of Lifeline checkpoint", out)), 4, out)
        runs = steps_printed(out)
        for rank in range(4):
            self.assertEqual(sorted(s for r, s in runs if r == rank), list(range(1, steps + 1)), out)
            for step in range(1, steps + 1):
                seen = runs[(rank, step)]
                self.assertEqual(len(seen), 2 if resume < step < kill_at else 1, (rank, step, seen))
                self.assertEqual(len(set(seen)), 1, f"rank {rank} step {step} differs after the resume: {seen}")
        # The stages hold other layers: their parameters differ, and the last stage's loss falls.
        self.assertNotEqual(runs[(0, steps)][0][1], runs[(2, steps)][0][1])
        self.assertLess(float.fromhex(runs[(2, steps)][0][0]), float.fromhex(runs[(2, 1)][0][0]))
        inspect = subprocess.run([os.path.join(BIN, "lifeline"), "inspect", "--json", ckpt_dir], capture_output=True,
                                 text=True, check=True)
        tensors = json.loads(inspect.stdout)["checkpoint"]["tensors"]
        itemsize = {"f32": 4, "bf16": 2, "f64": 8, "i64": 8, "i32": 4}
        size = {t["name"]: itemsize[t["dtype"]] * _numel(t["shape"]) for t in tensors}
        self.assertEqual({t["name"]: t["bytes"] for t in tensors}, size)  # each element once
        self.assertIn("lm_head.weight", size)  # the last stage's
        self.assertIn("tok_embeddings.weight", size)  # the first stage's

    def test_config_function_picks_lifeline_and_checkpointer_reads_what_it_saved(self):
        """One rank, synchronous saves, Lifeline chosen by a config function of the user's
        (tests/python/titan_config.py); the last step read back with lifeline.Checkpointer."""
        import lifeline
        tok_dir, data_dir = make_assets(self.tmp)
        rc, out, _log, ckpt_dir = run_under_agent(
            self.tmp, tok_dir, data_dir, ("titan_config", "llama3_debugmodel_lifeline"),
            ["--override.imports", "titan_cpu_attention.eager_cpu_attention"], nproc=1)
        self.assertEqual(rc, 0, out)
        self.assertIn(f"Lifeline checkpoints in {ckpt_dir} (sync saves)", out)
        reader = lifeline.Checkpointer(ckpt_dir, rank=0, world_size=1, run_id="test-reader")
        self.assertEqual(sorted(c["step"] for c in reader.list() if c["complete"]),
                         list(range(INTERVAL, STEPS + 1, INTERVAL)))  # keep_latest_k 0 keeps every step
        # The model's parameters of the last step, as torchtitan's trainer held them after it.
        described = lifeline.describe_source(ckpt_dir)
        self.assertEqual(described["step"], STEPS)
        others = ("optimizer.", "lr_scheduler.", "dataloader.", "train_state.")
        params = {t["name"]: torch.empty(t["shape"], dtype=torch.float32)
                  for t in described["tensors"] if not t["name"].startswith(others)}
        self.assertIn("tok_embeddings.weight", params)
        self.assertTrue(any(t["name"].startswith("optimizer.state.") for t in described["tensors"]))
        state = dict(params, train_state={"step": -1, "ntokens_seen": -1})
        self.assertEqual(reader.load(state), STEPS)
        self.assertEqual(state["train_state"]["step"], STEPS)
        self.assertEqual(state["train_state"]["ntokens_seen"], STEPS * 2 * 64)
        digest = hashlib.sha256()
        for name in sorted(params):
            digest.update(name.encode())
            digest.update(params[name].contiguous().view(torch.uint8).numpy().tobytes())
        printed = steps_printed(out)[(0, STEPS)]
        self.assertEqual(len(printed), 1, out)
        self.assertEqual(printed[0][1], digest.hexdigest()[:32], "the checkpoint's model state is not the trainer's")
        reader.close()


class TorchtitanInABucket(unittest.TestCase):
    """torchtitan's checkpoint.folder and the agent's --checkpoint-dir an s3:// prefix of the
    project's SeaweedFS cluster (docs/object-storage.md): the same kill and bit-exact resume as on a
    disk, the relaunch loading from the bucket (or this node's memory tier, whichever the agent
    fixed), and `lifeline ls`/`verify` reading the bucket."""

    @classmethod
    def setUpClass(cls):
        if NO_TORCHTITAN and not TORCHTITAN_REQUIRED:
            raise unittest.SkipTest(f"{NO_TORCHTITAN} for {sys.executable}: torchtitan 0.3 is tested in .venv")
        _scratch, cls.store = s3_cluster.start(cls)
        os.environ.update(cls.store)  # for the lifeline tool run by the checks

    def setUp(self):
        if NO_TORCHTITAN:
            self.fail(f"{NO_TORCHTITAN} in {sys.prefix}: tools/requirements.txt pins it (tools/setup installs it)")
        self.tmp = tempfile.mkdtemp(prefix="lifeline-titan-", dir=os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp"))
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def test_killed_rank_resumes_from_a_bucket_with_equal_state(self):
        folder = f"s3://{self.store['LIFELINE_S3_BUCKET']}/titan/run1"
        killed_and_resumed(self, self.tmp, ckpt_dir=folder, env=self.store)


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


if __name__ == "__main__":
    unittest.main()
