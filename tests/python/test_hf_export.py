"""Publishing to Hugging Face: `lifeline convert D --to safetensors OUT --rename-file RULES
[--dtype bf16]` of a Llama-style model saved over 2 ranks under training names (torchtitan's
`layers.N.attention.wq.weight`, ...) loads with PyPI's `safetensors` and with transformers'
`from_pretrained(OUT)`, one file and sharded with model.safetensors.index.json, every tensor equal
to the saved one (or to torch's own `.to(torch.bfloat16)` of it), no key missing or unexpected,
and the command's output says what it renamed and cast.

The model is built from a tiny LlamaConfig with random weights: nothing is downloaded.

Under the .venv (torch 2.x, tools/requirements.txt) a missing transformers or safetensors is a
failure; under Debian's /usr/bin/python3, which has neither, the tests skip saying so.
Environment (set by ctest): LIFELINE_BIN (build/bin), PYTHONPATH (the build's python package).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
import uuid

import torch

import lifeline

IN_VENV = os.path.basename(sys.prefix.rstrip(os.sep)) == ".venv"
try:
    import safetensors.torch
    import transformers
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
    transformers.utils.logging.disable_progress_bar()
    MISSING = None
except ImportError as e:
    MISSING = f"{e.name or e} is not installed for {sys.executable} (torch {torch.__version__})"

BIN = os.environ.get("LIFELINE_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin"))
LIFELINE = os.path.join(BIN, "lifeline")

# torchtitan's Llama names -> Hugging Face's LlamaForCausalLM names: what a user writes once per
# model family. (Meta's and torchtitan's own checkpoints also permute wq and wk for their rotary
# embedding; a rename cannot do that, and this model is stored in Hugging Face's layout.)
RULES = r"""# torchtitan -> Hugging Face (LlamaForCausalLM)
tok_embeddings\.weight=model.embed_tokens.weight
layers\.(\d+)\.attention\.wq\.weight=model.layers.$1.self_attn.q_proj.weight
layers\.(\d+)\.attention\.wk\.weight=model.layers.$1.self_attn.k_proj.weight
layers\.(\d+)\.attention\.wv\.weight=model.layers.$1.self_attn.v_proj.weight
layers\.(\d+)\.attention\.wo\.weight=model.layers.$1.self_attn.o_proj.weight
layers\.(\d+)\.feed_forward\.w1\.weight=model.layers.$1.mlp.gate_proj.weight
layers\.(\d+)\.feed_forward\.w2\.weight=model.layers.$1.mlp.down_proj.weight
layers\.(\d+)\.feed_forward\.w3\.weight=model.layers.$1.mlp.up_proj.weight
layers\.(\d+)\.attention_norm\.weight=model.layers.$1.input_layernorm.weight
layers\.(\d+)\.ffn_norm\.weight=model.layers.$1.post_attention_layernorm.weight
norm\.weight=model.norm.weight
output\.weight=lm_head.weight
"""
MODEL_PREFIXES = ["tok_embeddings.", "layers.", "norm.", "output."]  # --select: no optimizer state


def training_name(hf_name):
    """The inverse of RULES, written independently: how the training job names a tensor."""
    fixed = {"model.embed_tokens.weight": "tok_embeddings.weight", "model.norm.weight": "norm.weight",
             "lm_head.weight": "output.weight"}
    if hf_name in fixed:
        return fixed[hf_name]
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", hf_name)
    parts = {"self_attn.q_proj.weight": "attention.wq.weight", "self_attn.k_proj.weight": "attention.wk.weight",
             "self_attn.v_proj.weight": "attention.wv.weight", "self_attn.o_proj.weight": "attention.wo.weight",
             "mlp.gate_proj.weight": "feed_forward.w1.weight", "mlp.down_proj.weight": "feed_forward.w2.weight",
             "mlp.up_proj.weight": "feed_forward.w3.weight", "input_layernorm.weight": "attention_norm.weight",
             "post_attention_layernorm.weight": "ffn_norm.weight"}
    return f"layers.{m.group(1)}.{parts[m.group(2)]}"


def run(*args):
    p = subprocess.run([LIFELINE, *map(str, args)], capture_output=True, text=True)
    if p.returncode != 0:
        raise AssertionError(f"lifeline {' '.join(map(str, args))} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p.stdout


@unittest.skipIf(MISSING and not IN_VENV, f"{MISSING}: the Hugging Face export is tested under the .venv")
class HfExportTest(unittest.TestCase):
    def setUp(self):
        if MISSING:
            self.fail(f"{MISSING}: the .venv must have it (tools/requirements.txt; tools/setup installs it)")
        self.dir = tempfile.mkdtemp(prefix="lifeline-hf-export-")
        self.config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                                  tie_word_embeddings=False)
        torch.manual_seed(33)
        model = LlamaForCausalLM(self.config)
        with torch.no_grad():
            for p in model.parameters():  # random everywhere, the norms too (they start at 1)
                p.copy_(torch.randn_like(p))
        self.hf = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.assertEqual(len(self.hf), 3 + 9 * self.config.num_hidden_layers)
        self.ckpt = os.path.join(self.dir, "ckpt")
        self.save_over_two_ranks()
        self.rules = os.path.join(self.dir, "llama.rules")
        with open(self.rules, "w") as f:
            f.write(RULES)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def save_over_two_ranks(self):
        """Step 100 as a 2-rank job saves it: matrices split by rows, norms replicated, with
        optimizer state and an integer step the export leaves out or keeps as they are."""
        states = [{}, {}]
        for hf_name, t in self.hf.items():
            name = training_name(hf_name)
            for r in range(2):
                if t.dim() == 2:
                    rows = t.shape[0] // 2
                    states[r][name] = lifeline.Shard(t[r * rows:(r + 1) * rows].clone(), global_shape=tuple(t.shape),
                                                     offsets=(r * rows, 0))
                else:
                    states[r][name] = lifeline.Shard(t.clone(), replica=(r, 2))
        self.exp_avg = torch.randn(self.hf["model.norm.weight"].shape)
        for r in range(2):
            states[r]["optimizer.exp_avg.norm.weight"] = lifeline.Shard(self.exp_avg.clone(), replica=(r, 2))
            states[r]["train_step"] = lifeline.Shard(torch.tensor(100, dtype=torch.int64), replica=(r, 2))
        run_id = f"hf-export-{os.getpid()}-{uuid.uuid4().hex}"  # both ranks of this one launch
        ranks = [lifeline.Checkpointer(self.ckpt, rank=r, world_size=2, run_id=run_id) for r in range(2)]
        tickets = [ranks[r].save(100, states[r]) for r in range(2)]
        for t in tickets:
            t.wait()
        for c in ranks:
            c.close()

    def convert(self, out, *extra):
        report = json.loads(run("convert", self.ckpt, "--to", "safetensors", out, "--rename-file", self.rules,
                                *[a for p in MODEL_PREFIXES for a in ("--select", p)], *extra, "--json"))
        self.config.save_pretrained(out if not out.endswith(".safetensors") else os.path.dirname(out))
        return report

    def assert_renames_reported(self, report):
        self.assertEqual(report["tensors"], len(self.hf))
        self.assertEqual(report["rename_rules"], 12)
        self.assertEqual(report["unused_rules"], [])
        self.assertEqual(sorted((r["from"], r["to"]) for r in report["renamed"]),
                         sorted((training_name(k), k) for k in self.hf))

    def assert_loads_in_transformers(self, out, expected, dtype):
        for cls in (AutoModelForCausalLM, LlamaForCausalLM):
            model, info = cls.from_pretrained(out, dtype=dtype, output_loading_info=True)
            self.assertIsInstance(model, LlamaForCausalLM)
            for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
                self.assertEqual(list(info[kind]), [], f"{cls.__name__}.from_pretrained: {kind}")
            loaded = model.state_dict()
            self.assertEqual(sorted(loaded), sorted(expected))
            for k, v in expected.items():
                self.assertEqual(loaded[k].dtype, v.dtype, k)
                self.assertTrue(torch.equal(loaded[k], v), f"{cls.__name__}: {k} differs")

    def test_one_file_loads_in_safetensors_and_transformers_exactly(self):
        out = os.path.join(self.dir, "hf", "model.safetensors")
        os.makedirs(os.path.dirname(out))
        report = self.convert(out)
        self.assertEqual(report["outputs"], [out])
        self.assert_renames_reported(report)
        self.assertEqual(report["cast"], [])
        tensors = safetensors.torch.load_file(out)
        self.assertEqual(sorted(tensors), sorted(self.hf))
        for k, v in self.hf.items():
            self.assertEqual(tensors[k].dtype, torch.float32, k)
            self.assertTrue(torch.equal(tensors[k], v), k)
        self.assert_loads_in_transformers(os.path.dirname(out), self.hf, torch.float32)

    def test_shards_with_an_index_load_in_safetensors_and_transformers_exactly(self):
        out = os.path.join(self.dir, "hf-sharded")
        report = self.convert(out, "--max-shard-size", "100KiB")
        shards = [p for p in report["outputs"] if p.endswith(".safetensors")]
        self.assertGreaterEqual(len(shards), 3)
        with open(os.path.join(out, "model.safetensors.index.json")) as f:
            index = json.load(f)
        self.assertEqual(sorted(index["weight_map"]), sorted(self.hf))
        self.assertEqual(index["metadata"]["total_size"], sum(v.numel() * 4 for v in self.hf.values()))
        tensors = {}
        for shard in shards:
            for k, v in safetensors.torch.load_file(shard).items():
                self.assertEqual(index["weight_map"][k], os.path.basename(shard))
                tensors[k] = v
        self.assertEqual(sorted(tensors), sorted(self.hf))
        for k, v in self.hf.items():
            self.assertTrue(torch.equal(tensors[k], v), k)
        self.assert_loads_in_transformers(out, self.hf, torch.float32)

    def test_bf16_export_equals_torchs_own_cast_and_says_so(self):
        expected = {k: v.to(torch.bfloat16) for k, v in self.hf.items()}
        for out, extra in ((os.path.join(self.dir, "bf16"), ()),
                           (os.path.join(self.dir, "bf16-sharded"), ("--max-shard-size", "64KiB"))):
            report = self.convert(out, "--dtype", "bf16", *extra)
            self.assert_renames_reported(report)
            self.assertEqual(report["dtype"], "bf16")
            self.assertEqual(sorted((c["name"], c["from"], c["to"]) for c in report["cast"]),
                             sorted((k, "f32", "bf16") for k in self.hf))
            self.assertEqual(report["bytes"], sum(v.numel() * 2 for v in self.hf.values()))
            tensors = {}
            for shard in (p for p in report["outputs"] if p.endswith(".safetensors")):
                tensors.update(safetensors.torch.load_file(shard))
            self.assertEqual(sorted(tensors), sorted(expected))
            for k, v in expected.items():
                self.assertEqual(tensors[k].dtype, torch.bfloat16, k)
                self.assertTrue(torch.equal(tensors[k], v), k)
            self.assert_loads_in_transformers(out, expected, torch.bfloat16)

        # The text output states the cast and the renames too.
        text = run("convert", self.ckpt, "--to", "safetensors", os.path.join(self.dir, "text.safetensors"),
                   "--rename-file", self.rules, "--dtype", "bf16", "--rename", "train_step=step")
        self.assertIn(f"cast {len(self.hf) + 1} tensor(s) f32 -> bf16: ", text)  # + the optimizer's
        self.assertIn("not cast (integers and bool keep their dtype): 'step'", text)
        self.assertIn(f"renamed {len(self.hf) + 1} of {len(self.hf) + 2} tensors by 13 rule(s): ", text)
        self.assertIn("'tok_embeddings.weight' -> 'model.embed_tokens.weight'", text)
        everything = safetensors.torch.load_file(os.path.join(self.dir, "text.safetensors"))
        self.assertEqual(everything["step"].dtype, torch.int64)
        self.assertEqual(everything["step"].item(), 100)
        self.assertTrue(torch.equal(everything["optimizer.exp_avg.norm.weight"], self.exp_avg.to(torch.bfloat16)))

    def test_python_convert_takes_the_same_options(self):
        out = os.path.join(self.dir, "py")
        report = lifeline.convert(self.ckpt, out, "safetensors", rename_file=self.rules, select=MODEL_PREFIXES,
                                  dtype=torch.bfloat16, max_shard_bytes=64 << 10)
        self.assertEqual(len(report["renamed"]), len(self.hf))
        self.assertEqual({(c["source_name"], c["name"], c["source_dtype"], c["dtype"]) for c in report["cast"]},
                         {(training_name(k), k, "f32", "bf16") for k in self.hf})
        self.config.save_pretrained(out)
        self.assert_loads_in_transformers(out, {k: v.to(torch.bfloat16) for k, v in self.hf.items()}, torch.bfloat16)
        # A rule that sends two tensors to one name is refused naming both; nothing is written.
        bad = os.path.join(self.dir, "bad")
        with self.assertRaises(lifeline.Error) as e:
            lifeline.convert(self.ckpt, bad, "safetensors", rename=[r"layers\.\d+\.ffn_norm\.weight=norm"])
        self.assertEqual(e.exception.code, "InvalidArgument")
        self.assertIn("'layers.0.ffn_norm.weight' and 'layers.1.ffn_norm.weight'", str(e.exception))
        self.assertFalse(os.path.exists(bad))


if __name__ == "__main__":
    unittest.main()
