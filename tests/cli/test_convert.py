"""`lifeline convert`, `reshard`, `ls`, `gc` and `diff`, end to end, with Debian's /usr/bin/python3.

The HDF5 export is read back with h5py and compared with what the library loads (through the
lifeline Python package); the safetensors export is parsed by a reader written here from the
published layout (8-byte little-endian header length, JSON header, data buffer); round trips are
byte-exact; hostile HDF5 and safetensors inputs fail with a clear error and never crash.

Environment (set by ctest): LIFELINE_BIN (build/bin), PYTHONPATH (build/python).
"""
import hashlib
import json
import os
import shutil
import struct
import subprocess
import tempfile
import unittest

import h5py
import numpy as np
import torch

import lifeline

BIN = os.environ.get("LIFELINE_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin"))
LIFELINE = os.path.join(BIN, "lifeline")

# safetensors dtype -> (element size, numpy dtype used to build test data)
ST_DTYPES = {
    "F64": (8, "<f8"), "F32": (4, "<f4"), "F16": (2, "<f2"), "BF16": (2, "<u2"), "F8_E4M3": (1, "u1"),
    "F8_E5M2": (1, "u1"), "I64": (8, "<i8"), "I32": (4, "<i4"), "I16": (2, "<i2"), "I8": (1, "i1"),
    "U8": (1, "u1"), "BOOL": (1, "u1"),
}
TORCH_DTYPES = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
                "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8, "u8": torch.uint8,
                "bool": torch.bool}


def run(*args, check=True):
    p = subprocess.run([LIFELINE, *map(str, args)], capture_output=True, text=True)
    if p.returncode < 0:
        raise AssertionError(f"lifeline {' '.join(map(str, args))} died of signal {-p.returncode}: {p.stderr}")
    if check and p.returncode != 0:
        raise AssertionError(f"lifeline {' '.join(map(str, args))} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


def run_json(*args, check=True):
    p = run(*args, "--json", check=check)
    return p.returncode, json.loads(p.stdout)


def read_safetensors(path):
    """An independent reader of the published layout: {name: (dtype, shape, raw bytes)}, metadata."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert 8 + n <= len(blob), f"{path}: header length past the end"
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    out, spans = {}, []
    for name, e in header.items():
        begin, end = e["data_offsets"]
        size = ST_DTYPES[e["dtype"]][0]
        count = 1
        for d in e["shape"]:
            count *= d
        assert end - begin == count * size, f"{name}: size mismatch"
        assert 0 <= begin <= end <= len(data)
        spans.append((begin, end))
        out[name] = (e["dtype"], tuple(e["shape"]), data[begin:end])
    spans.sort()
    # The published layout leaves no holes and no overlaps, and the buffer ends at the last tensor.
    at = 0
    for b, e in spans:
        assert b == at, f"{path}: hole or overlap at {b}"
        at = e
    assert at == len(data), f"{path}: {len(data) - at} bytes after the last tensor"
    assert (8 + n) % 8 == 0, "data buffer not 8-byte aligned"
    return out, meta


def write_safetensors(path, tensors, metadata=None, header_override=None):
    """A writer of the published layout, independent of Lifeline's (no padding, keys reversed)."""
    header, data = {}, b""
    for name, (dtype, shape, raw) in reversed(list(tensors.items())):
        header[name] = {"shape": list(shape), "dtype": dtype, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata:
        header["__metadata__"] = metadata
    text = header_override if header_override is not None else json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def library_load(directory, names_dtypes_shapes):
    """What the library loads: every tensor whole, through the Python package, as raw bytes."""
    state = {name: torch.zeros(shape, dtype=TORCH_DTYPES[dt]) for name, dt, shape in names_dtypes_shapes}
    ckpt = lifeline.Checkpointer(directory, rank=0, world_size=1)
    ckpt.load(state)
    ckpt.close()
    out = {}
    for name, t in state.items():
        t = t.contiguous()
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        out[name] = t.numpy().tobytes()
    return out


class ConvertTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="lifeline-convert-", dir="/var/tmp")  # on disk: O_DIRECT
        cls.ckpt = os.path.join(cls.tmp, "D")
        run("bench", "save", "--dir", cls.ckpt, "--ranks", 4, "--tp", 2, "--dp", 2, "--state-bytes", "6MiB",
            "--hidden", 128, "--iterations", 1, "--no-baseline")
        cls.h5 = os.path.join(cls.tmp, "out.h5")
        run("convert", cls.ckpt, "--to", "hdf5", cls.h5, "--deflate", 4)
        cls.st = os.path.join(cls.tmp, "st")
        run("convert", cls.ckpt, "--to", "safetensors", cls.st, "--max-shard-size", "1MiB")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.tmp, name)

    def h5_tensors(self):
        with h5py.File(self.h5, "r") as f:
            return {f[k].attrs["lifeline_name"]: (f[k].attrs["lifeline_dtype"], f[k].shape, f[k][()])
                    for k in f["tensors"].keys() for k in ["tensors/" + k]}

    def test_hdf5_export_read_with_h5py_equals_what_the_library_loads(self):
        tensors = self.h5_tensors()
        self.assertGreater(len(tensors), 20)
        loaded = library_load(self.ckpt, [(n, dt, tuple(shape)) for n, (dt, shape, _) in tensors.items()])
        dtypes = set()
        for name, (dt, shape, arr) in tensors.items():
            dtypes.add(dt)
            self.assertEqual(np.asarray(arr).tobytes(), loaded[name], name)
            if dt == "bf16":
                self.assertEqual(arr.dtype, np.uint16, "bf16 is stored as its raw 16 bits")
            if dt == "f16":
                self.assertEqual(arr.dtype, np.float16, "h5py reads f16 natively")
        self.assertTrue({"bf16", "f16", "f32", "i64"} <= dtypes, dtypes)
        with h5py.File(self.h5, "r") as f:
            self.assertEqual(f.attrs["lifeline_format"], "lifeline-hdf5/1")
            self.assertEqual(f.attrs["lifeline_step"], "100")
            meta = json.loads(f.attrs["lifeline_metadata"])
            self.assertEqual(meta["model"], "lifeline-synthetic")
            self.assertEqual(f.attrs["model"], "lifeline-synthetic", "metadata keys are attributes too")
            self.assertEqual(f.attrs["hidden"], "128")
            # Per-rank objects: 4 ranks x (rng, dataloader).
            self.assertEqual(sorted(f["objects"].keys()), ["rank0", "rank1", "rank2", "rank3"])
            self.assertEqual(json.loads(bytes(f["objects/rank2/dataloader"][()]))["rank"], 2)
            ds = f["tensors/layers.0.mlp.fc1.weight"]
            self.assertIsNotNone(ds.chunks, "datasets are chunked")
            self.assertEqual(ds.compression, "gzip")

    def test_safetensors_export_parsed_from_the_published_layout_equals_hdf5_byte_for_byte(self):
        with open(os.path.join(self.st, "model.safetensors.index.json")) as f:
            index = json.load(f)
        files = sorted(set(index["weight_map"].values()))
        self.assertGreater(len(files), 1, "--max-shard-size 1MiB splits the export")
        self.assertTrue(all(f.startswith("model-") and f.endswith(f"-of-{len(files):05d}.safetensors") for f in files))
        st_tensors, total = {}, 0
        for name in files:
            tensors, meta = read_safetensors(os.path.join(self.st, name))
            self.assertEqual(meta.get("format"), "pt")
            for t, v in tensors.items():
                self.assertEqual(index["weight_map"][t], name)
                total += len(v[2])
            st_tensors.update(tensors)
        self.assertEqual(index["metadata"]["total_size"], total)
        h5 = self.h5_tensors()
        self.assertEqual(set(st_tensors), set(h5))
        names = {"bf16": "BF16", "f16": "F16", "f32": "F32", "i64": "I64"}
        for name, (dt, shape, arr) in h5.items():
            sdt, sshape, raw = st_tensors[name]
            self.assertEqual(sdt, names[dt], name)
            self.assertEqual(sshape, tuple(shape), name)
            self.assertEqual(raw, np.asarray(arr).tobytes(), name)
        # The tool agrees: same tensors, objects and metadata.
        rc, j = run_json("diff", self.h5, self.st)
        self.assertEqual(rc, 0, j)
        self.assertTrue(j["identical"])
        self.assertEqual(j["tensors_identical"], len(h5))

    def test_converted_and_resharded_checkpoints_load_with_zero_mismatches(self):
        d2, d3 = self.path("D2"), self.path("D3")
        rc, j = run_json("convert", self.h5, "--to", "lifeline", d2, "--ranks", 2, "--tp", 2, "--dp", 1)
        self.assertEqual((j["ranks"], j["tp"], j["dp"], j["step"]), (2, 2, 1, 100))
        self.assertEqual(j["placement"], "synthetic model")
        rc, j = run_json("reshard", self.ckpt, "--to", d3, "--ranks", 6, "--tp", 2, "--dp", 3)
        self.assertEqual(j["ranks"], 6)
        for d, ranks, tp, dp in [(d2, 2, 2, 1), (d3, 6, 2, 3)]:
            rc, j = run_json("bench", "load", "--dir", d, "--ranks", ranks, "--tp", tp, "--dp", dp)
            self.assertEqual(rc, 0, j)
            self.assertEqual(j["mismatches"], 0)
            self.assertEqual(j["object_mismatches"], 0)
            self.assertEqual(j["saved_world_size"], ranks)
            # Each rank reads its own fragments: little more than what it asked for.
            self.assertLess(j["bytes_read"], 1.1 * j["bytes"] + 65536 * ranks)
        # Loaded with yet another layout, both still hold the same model.
        rc, j = run_json("bench", "load", "--dir", d3, "--ranks", 3, "--tp", 3)
        self.assertEqual(j["mismatches"], 0)
        rc, j = run_json("diff", self.ckpt, d3)
        self.assertTrue(j["identical"], j)

    def test_objects_of_ranks_beyond_a_converted_world_load_with_more_ranks(self):
        # Saved by 4 ranks, converted to 2 (ranks 2 and 3's objects folded into ranks 0 and 1),
        # loaded by 3 and 4 ranks: every rank gets the objects its saved rank wrote.
        d = self.path("D2-objects")
        run("convert", self.h5, "--to", "lifeline", d, "--ranks", 2, "--tp", 2, "--dp", 1)
        for ranks in (3, 4):
            rc, j = run_json("bench", "load", "--dir", d, "--ranks", ranks, "--tp", ranks, check=False)
            self.assertEqual(rc, 0, j)
            self.assertEqual(j["objects_checked"], 2 * ranks)
            self.assertEqual(j["object_mismatches"], 0, f"loaded by {ranks} ranks")
        # The tools read the same rule: the 2-rank checkpoint holds what the 4 ranks saved.
        rc, j = run_json("diff", self.ckpt, d)
        self.assertTrue(j["identical"], j)

    def test_bench_load_refuses_metadata_claiming_a_huge_model(self):
        meta = json.dumps({"model": "lifeline-synthetic", "hidden": 64, "layers": 100000000, "tp": 1, "dp": 1})
        src = self.path("huge-claim.safetensors")
        write_safetensors(src, {"x": ("F32", (4,), bytes(16))}, {"format": "pt", "lifeline_metadata": meta})
        d = self.path("huge-claim")
        run("convert", src, "--to", "lifeline", d, "--ranks", 1)
        p = run("bench", "load", "--dir", d, "--ranks", 1, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn('"layers" is 100000000', p.stderr)
        self.assertIn(d, p.stderr)
        self.assertNotIn("bad_alloc", p.stderr)

    def test_bool_bytes_other_than_0_and_1_are_refused_by_every_output(self):
        flags = bytearray([0, 1] * 8)
        flags[11] = 2  # element [2, 3] of a [4, 4] tensor
        src = self.path("bad-bool.safetensors")
        write_safetensors(src, {"ok": ("F32", (2,), bytes(8)), "mask": ("BOOL", (4, 4), bytes(flags))})
        outputs = [("lifeline", self.path("bad-bool-ckpt"), "--ranks", 2),
                   ("hdf5", self.path("bad-bool.h5")),
                   ("safetensors", self.path("bad-bool-again.safetensors"))]
        for to, out, *more in outputs:
            p = run("convert", src, "--to", to, out, *more, check=False)
            self.assertNotEqual(p.returncode, 0, to)
            self.assertIn("'mask'", p.stderr, to)
            self.assertIn("element 11 [2, 3]", p.stderr, to)
            self.assertIn("0x02", p.stderr, to)
            self.assertFalse(os.path.exists(out) and to != "lifeline", f"{to}: no output is left behind")
        # A checkpoint holding such bytes (saved through the library, which stores what it is given)
        # cannot be exported either.
        d = self.path("bad-bool-saved")
        mask = torch.tensor([True, False, True, True])
        mask.view(torch.uint8)[2] = 7
        ckpt = lifeline.Checkpointer(d, rank=0, world_size=1)
        ckpt.save(1, {"mask": mask}).wait()
        ckpt.close()
        p = run("convert", d, "--to", "safetensors", self.path("bad-bool-saved.safetensors"), check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("bool tensor 'mask'", p.stderr)
        self.assertIn("element 2 [2]", p.stderr)

    def test_many_small_tensors_to_hdf5_and_back(self):
        # 20,000 tiny tensors (the export once cost milliseconds per tensor): every one arrives.
        tensors = {}
        for i in range(20000):
            if i % 3 == 0:
                tensors[f"blocks.{i}.scale"] = ("F32", (3,), np.arange(3, dtype="<f4").__add__(i).tobytes())
            elif i % 3 == 1:
                tensors[f"blocks.{i}.ids"] = ("I64", (2, 2), np.full((2, 2), i, dtype="<i8").tobytes())
            else:
                tensors[f"blocks/{i}/flag"] = ("BOOL", (), bytes([i % 2]))
        src = self.path("many.safetensors")
        write_safetensors(src, tensors, {"format": "pt"})
        h5 = self.path("many.h5")
        rc, j = run_json("convert", src, "--to", "hdf5", h5)
        self.assertEqual(j["tensors"], len(tensors))
        with h5py.File(h5, "r") as f:
            group = f["tensors"]
            self.assertEqual(len(group), len(tensors))
            for key in group:
                ds = group[key]
                name = ds.attrs["lifeline_name"]
                dt, shape, raw = tensors[name]
                self.assertEqual(ds.shape, shape, name)
                self.assertEqual(np.asarray(ds[()]).tobytes(), raw, name)
        back = self.path("many-again.safetensors")
        run("convert", h5, "--to", "safetensors", back)
        again, _ = read_safetensors(back)
        self.assertEqual(again, tensors)

    def test_round_trips_are_byte_exact(self):
        # safetensors -> lifeline (3 ranks, zstd) -> safetensors: the same files, byte for byte.
        d = self.path("from-st")
        run("convert", self.st, "--to", "lifeline", d, "--ranks", 3, "--codec", "zstd-bytegroup")
        again = self.path("st-again")
        run("convert", d, "--to", "safetensors", again, "--max-shard-size", "1MiB")
        for name in sorted(os.listdir(self.st)):
            with open(os.path.join(self.st, name), "rb") as a, open(os.path.join(again, name), "rb") as b:
                self.assertEqual(a.read(), b.read(), name)
        self.assertEqual(sorted(os.listdir(self.st)), sorted(os.listdir(again)))
        # hdf5 -> lifeline (2 ranks: the objects of ranks 2 and 3 ride along) -> hdf5: identical.
        d = self.path("from-h5")
        run("convert", self.h5, "--to", "lifeline", d, "--ranks", 2)
        h5b = self.path("again.h5")
        run("convert", d, "--to", "hdf5", h5b)
        rc, j = run_json("diff", self.h5, h5b)
        self.assertTrue(j["identical"], j)
        with h5py.File(h5b, "r") as f:
            self.assertEqual(sorted(f["objects"].keys()), ["rank0", "rank1", "rank2", "rank3"])

    def test_every_dtype_from_a_foreign_safetensors_file(self):
        rng = np.random.default_rng(7)
        tensors = {}
        for i, (dt, (size, npdt)) in enumerate(ST_DTYPES.items()):
            shape = (3, 5) if i % 2 else (7,)
            arr = rng.integers(0, 2 if dt == "BOOL" else 120, size=shape).astype(npdt)
            tensors[f"t.{dt.lower()}"] = (dt, shape, arr.tobytes())
        tensors["scalar"] = ("F32", (), np.float32(2.5).tobytes())
        tensors["empty"] = ("F32", (0, 4), b"")
        src = self.path("foreign.safetensors")
        write_safetensors(src, tensors, {"format": "pt", "note": "written by hand"})
        d = self.path("foreign-ckpt")
        run("convert", src, "--to", "lifeline", d, "--ranks", 2, "--tp", 2)
        out = self.path("foreign-again.safetensors")
        run("convert", d, "--to", "safetensors", out)
        back, meta = read_safetensors(out)
        self.assertEqual(set(back), set(tensors))
        for name, (dt, shape, raw) in tensors.items():
            self.assertEqual(back[name], (dt, shape, raw), name)
        self.assertEqual(meta["note"], "written by hand")
        h5 = self.path("foreign.h5")
        run("convert", d, "--to", "hdf5", h5)
        with h5py.File(h5, "r") as f:
            self.assertEqual(f["tensors/t.bool"].dtype, np.bool_)
            self.assertEqual(f["tensors/t.f16"].dtype, np.float16)
            self.assertEqual(f["tensors/t.f8_e4m3"].attrs["lifeline_dtype"], "f8e4m3")
            self.assertEqual(f["tensors/scalar"][()], 2.5)
            for name, (dt, shape, raw) in tensors.items():
                self.assertEqual(np.asarray(f["tensors/" + name][()]).tobytes(), raw, name)

    def test_select_exports_only_the_model(self):
        out = self.path("model-only.safetensors")
        rc, j = run_json("convert", self.ckpt, "--to", "safetensors", out, "--select", "layers.")
        tensors, meta = read_safetensors(out)
        self.assertTrue(tensors)
        self.assertTrue(all(n.startswith("layers.") for n in tensors))
        self.assertFalse(any(n.startswith("optim.") for n in tensors))
        # The per-rank objects (rng, dataloader) are not under layers.: left out like the tensors.
        self.assertEqual([k for k in meta if k.startswith("lifeline_object.")], [])
        whole = self.path("whole.safetensors")
        run_json("convert", self.ckpt, "--to", "safetensors", whole)
        self.assertTrue([k for k in read_safetensors(whole)[1] if k.startswith("lifeline_object.")],
                        "without --select the objects are exported")
        rc, j = run_json("diff", self.ckpt, out, check=False)
        self.assertEqual(rc, 1)
        self.assertFalse(j["identical"])
        self.assertIn("step", j["missing_in_b"])
        self.assertEqual(j["tensors_identical"], len(tensors))

    def test_diff_names_the_tensor_that_differs(self):
        src = self.path("one.safetensors")
        vals = np.arange(12, dtype="<f4")
        write_safetensors(src, {"w": ("F32", (3, 4), vals.tobytes()), "b": ("I64", (2,), np.arange(2).tobytes())})
        other = self.path("other.safetensors")
        vals2 = vals.copy()
        vals2[5] += 0.25
        vals2[9] -= 3
        write_safetensors(other, {"w": ("F32", (3, 4), vals2.tobytes()), "b": ("I64", (2,), np.arange(2).tobytes())})
        rc, j = run_json("diff", src, other, check=False)
        self.assertEqual(rc, 1)
        self.assertEqual(len(j["differing"]), 1)
        d = j["differing"][0]
        self.assertEqual((d["name"], d["elements_differing"], d["first_index"]), ("w", 2, 5))
        self.assertAlmostEqual(d["max_abs_diff"], 3.0)
        self.assertEqual(j["elements_differing"], 2)
        self.assertEqual(j["largest_difference"]["name"], "w")
        self.assertAlmostEqual(j["largest_difference"]["max_abs_diff"], 3.0)
        p = run("diff", src, other, check=False)
        self.assertIn("'w': 2 of 12 elements differ", p.stdout)
        # The summary says why the tensors it does not count as identical differ.
        self.assertIn("1 of 2 common tensors identical", p.stdout)
        self.assertIn("differ in 2 element(s), by at most 3 (in 'w')", p.stdout)

    def test_diff_reads_metadata_as_json_and_says_where_it_differs(self):
        # Issue 32, item 14: diff exited 1 after a lossless round trip, saying nothing of why.
        def save(name, metadata):
            d = self.path(name)
            c = lifeline.Checkpointer(d, rank=0, world_size=1, run_id=name)
            c.save(1, {"w": torch.arange(6.0)}, metadata=metadata).wait()
            c.close()
            return d
        a = save("meta-a", {"lr": 0.1, "schedule": {"warmup": 10, "decay": "cosine"}})
        same = save("meta-b", {"schedule": {"decay": "cosine", "warmup": 10}, "lr": 0.1})  # another key order
        other = save("meta-c", {"lr": 0.2, "schedule": {"warmup": 10, "decay": "cosine"}})
        rc, j = run_json("diff", a, same)
        self.assertEqual((rc, j["identical"], j["metadata_differs"]), (0, True, False))
        p = run("diff", a, other, check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("metadata differs: '/lr': A 0.1, B 0.2", p.stdout)
        self.assertIn("different: 1 of 1 common tensors identical", p.stdout)
        self.assertIn("metadata differing", p.stdout)

    def test_existing_output_is_kept_unless_forced(self):
        out = self.path("exists.h5")
        with open(out, "w") as f:
            f.write("precious")
        p = run("convert", self.ckpt, "--to", "hdf5", out, check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("--force", p.stderr)
        with open(out) as f:
            self.assertEqual(f.read(), "precious")
        run("convert", self.ckpt, "--to", "hdf5", out, "--force")
        self.assertTrue(h5py.is_hdf5(out))
        # A step that already exists is never overwritten either.
        p = run("reshard", self.ckpt, "--to", self.ckpt, "--ranks", 2, check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("AlreadyExists", p.stderr)


class RenameAndCastTest(unittest.TestCase):
    """--rename, --rename-file and --dtype: training names to Hugging Face's, floating tensors cast
    as torch casts them, integers kept, and every mistake refused naming the tensors involved."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="lifeline-rename-", dir="/var/tmp")
        self.src = os.path.join(self.dir, "in.safetensors")
        torch.manual_seed(5)
        w = torch.randn(8, 4)
        # The edges of bf16's rounding: ties both ways, overflow, subnormals, infinities, NaN.
        w.view(-1)[:10] = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, 3.4e38, -3.4e38, 1e-40, -0.0,
                                        float("inf"), float("-inf"), float("nan"), 2 ** -133])
        self.w = w
        self.h = torch.randn(5).to(torch.float16)
        tensors = {"layers.0.attention.wq.weight": ("F32", (8, 4), w.numpy().tobytes()),
                   "layers.1.attention.wq.weight": ("F32", (8, 4), (w * 2).numpy().tobytes()),
                   "norm.h": ("F16", (5,), self.h.numpy().tobytes()),
                   "steps": ("I64", (3,), np.arange(3, dtype="<i8").tobytes())}
        write_safetensors(self.src, tensors)
        self.rules = os.path.join(self.dir, "rules")
        with open(self.rules, "w") as f:
            f.write("# training -> Hugging Face\n\n"
                    "layers\\.(\\d+)\\.attention\\.wq\\.weight=model.layers.$1.self_attn.q_proj.weight\n"
                    "  unused\\.name=nothing  \n")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_renamed_and_cast_to_bf16_bit_for_bit_as_torch(self):
        out = os.path.join(self.dir, "out.safetensors")
        rc, j = run_json("convert", self.src, "--to", "safetensors", out, "--rename-file", self.rules,
                         "--rename", "norm\\.(.*)=model.norm.$1", "--dtype", "bf16")
        self.assertEqual(rc, 0, j)
        self.assertEqual(j["rename_rules"], 3)
        self.assertEqual(j["unused_rules"], ["unused\\.name=nothing"])
        # (In the source's order: the writer here stores the tensors in reverse.)
        self.assertEqual(j["renamed"], [
            {"from": "norm.h", "to": "model.norm.h"},
            {"from": "layers.1.attention.wq.weight", "to": "model.layers.1.self_attn.q_proj.weight"},
            {"from": "layers.0.attention.wq.weight", "to": "model.layers.0.self_attn.q_proj.weight"}])
        self.assertEqual(j["dtype"], "bf16")
        self.assertEqual([(c["source_name"], c["name"], c["from"], c["to"]) for c in j["cast"]],
                         [("norm.h", "model.norm.h", "f16", "bf16"),
                          ("layers.1.attention.wq.weight", "model.layers.1.self_attn.q_proj.weight", "f32", "bf16"),
                          ("layers.0.attention.wq.weight", "model.layers.0.self_attn.q_proj.weight", "f32", "bf16")])
        self.assertEqual(j["not_cast"], ["steps"])
        self.assertEqual(j["bytes"], 2 * 32 * 2 + 5 * 2 + 3 * 8)
        tensors, _ = read_safetensors(out)
        self.assertEqual(sorted(tensors), ["model.layers.0.self_attn.q_proj.weight",
                                           "model.layers.1.self_attn.q_proj.weight", "model.norm.h", "steps"])
        self.assertEqual(tensors["steps"], ("I64", (3,), np.arange(3, dtype="<i8").tobytes()))
        for name, original in (("model.layers.0.self_attn.q_proj.weight", self.w),
                               ("model.layers.1.self_attn.q_proj.weight", self.w * 2),
                               ("model.norm.h", self.h)):
            dtype, shape, raw = tensors[name]
            self.assertEqual((dtype, shape), ("BF16", tuple(original.shape)))
            got = np.frombuffer(raw, dtype="<u2")
            want = original.to(torch.bfloat16).view(torch.int16).numpy().view("<u2").reshape(-1)
            nan = torch.isnan(original.reshape(-1)).numpy()
            np.testing.assert_array_equal(got[~nan], want[~nan], err_msg=name)
            # NaN stays NaN (torch's own kernels disagree on its bits).
            self.assertTrue(all((g & 0x7F80) == 0x7F80 and (g & 0x7F) for g in got[nan]), name)

        # The text output says the same.
        text = run("convert", self.src, "--to", "safetensors", os.path.join(self.dir, "t.safetensors"),
                   "--rename-file", self.rules, "--dtype", "f16").stdout
        self.assertIn("renamed 2 of 4 tensors by 2 rule(s): 'layers.1.attention.wq.weight' -> "
                      "'model.layers.1.self_attn.q_proj.weight', 'layers.0.attention.wq.weight' -> "
                      "'model.layers.0.self_attn.q_proj.weight'\n", text)
        self.assertIn("rules that matched no tensor: 'unused\\.name=nothing'", text)
        self.assertIn("cast 2 tensor(s) f32 -> f16: 'model.layers.1.self_attn.q_proj.weight', "
                      "'model.layers.0.self_attn.q_proj.weight'\n", text)
        self.assertIn("not cast (integers and bool keep their dtype): 'steps'", text)
        self.assertNotIn("f16 -> f16", text)

    def test_select_applies_to_the_source_names_and_a_checkpoint_gets_the_new_ones(self):
        ckpt = os.path.join(self.dir, "ckpt")
        rc, j = run_json("convert", self.src, "--to", "lifeline", ckpt, "--select", "layers.", "--rename-file",
                         self.rules, "--dtype", "f32", "--ranks", 2, "--buffered-io")
        self.assertEqual(rc, 0, j)
        self.assertEqual(j["tensors"], 2)
        self.assertEqual(j["cast"], [])  # already f32
        rc, info = run_json("inspect", ckpt)
        self.assertEqual(rc, 0, info)
        self.assertIn("model.layers.1.self_attn.q_proj.weight", json.dumps(info))

    def test_mistakes_are_refused_naming_the_tensors_and_write_nothing(self):
        out = os.path.join(self.dir, "out")
        for args, code, words in (
                (("--rename", "layers\\.\\d+\\.attention\\.wq\\.weight=q"), "InvalidArgument",
                 ["'layers.1.attention.wq.weight' and 'layers.0.attention.wq.weight'", "'q'"]),
                (("--rename", "steps="), "InvalidArgument", ["'steps'", "empty name"]),
                (("--rename", "no-equals-sign"), "InvalidArgument", ["no-equals-sign", "PATTERN=REPLACEMENT"]),
                (("--rename", "(=x"), "InvalidArgument", ["'(=x'", "regular expression"]),
                (("--dtype", "i32"), "InvalidArgument", ["'norm.h' (f16)", "i32"]),
                (("--dtype", "f8e4m3"), "InvalidArgument", ["f8e4m3"]),
                (("--dtype", "half-ish"), "InvalidArgument", ["half-ish"]),
                (("--rename-file", os.path.join(self.dir, "missing")), "NotFound", ["--rename-file", "missing"])):
            rc, j = run_json("convert", self.src, "--to", "safetensors", out, *args, check=False)
            self.assertNotEqual(rc, 0, args)
            self.assertEqual(j["code"], code, j)
            for w in words:
                self.assertIn(w, j["error"], args)
            self.assertFalse(os.path.exists(out), args)
        bad = os.path.join(self.dir, "bad.rules")
        with open(bad, "w") as f:
            f.write("# fine\na=b\nnot a rule\n")
        rc, j = run_json("convert", self.src, "--to", "safetensors", out, "--rename-file", bad, check=False)
        self.assertEqual(j["code"], "InvalidArgument")
        self.assertIn(bad + ":3", j["error"])


class HostileInputTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="lifeline-hostile-", dir="/var/tmp")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def expect_error(self, src, *words, to="hdf5"):
        out = os.path.join(self.tmp, "out.h5" if to == "hdf5" else "out")
        p = run("convert", src, "--to", to, out, check=False)
        self.assertIn(p.returncode, (1, 2), p.stderr)
        self.assertIn(os.path.basename(src), p.stderr, "the error names the file")
        for w in words:
            self.assertIn(w, p.stderr)
        self.assertFalse(os.path.exists(out), "nothing is left behind")
        self.assertEqual([n for n in os.listdir(self.tmp) if ".tmp-" in n], [])
        return p.stderr

    def st_file(self, name, header, data=b""):
        path = os.path.join(self.tmp, name)
        text = json.dumps(header).encode() if isinstance(header, dict) else header
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + data)
        return path

    def test_hostile_safetensors(self):
        # Header length past the end of the file.
        path = os.path.join(self.tmp, "long.safetensors")
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", 1 << 40) + b"{}")
        self.expect_error(path)
        self.expect_error(self.st_file("notjson.safetensors", b"{not json"))
        self.expect_error(self.st_file("past.safetensors", {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
                                       b"\0" * 8), "w")
        self.expect_error(self.st_file("overlap.safetensors", {
            "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
            "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}, b"\0" * 24), "overlap")
        self.expect_error(self.st_file("mismatch.safetensors", {"w": {"dtype": "F64", "shape": [4], "data_offsets": [0, 16]}},
                                       b"\0" * 16), "w")
        self.expect_error(self.st_file("huge.safetensors", {"w": {"dtype": "F32", "shape": [2 ** 40, 2 ** 40, 2 ** 40],
                                                                  "data_offsets": [0, 16]}}, b"\0" * 16), "w")
        self.expect_error(self.st_file("u16.safetensors", {"w": {"dtype": "U16", "shape": [2], "data_offsets": [0, 4]}},
                                       b"\0" * 4), "U16")

    def test_an_index_cannot_reach_outside_its_directory(self):
        d = os.path.join(self.tmp, "evil")
        os.mkdir(d)
        secret = os.path.join(self.tmp, "secret.safetensors")
        write_safetensors(secret, {"w": ("F32", (1,), b"\0\0\0\0")})
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 4}, "weight_map": {"w": "../secret.safetensors"}}, f)
        err = self.expect_error(d, "../secret.safetensors")
        self.assertIn("model.safetensors.index.json", err)

    def test_hostile_hdf5(self):
        def h5(name, fill):
            path = os.path.join(self.tmp, name)
            with h5py.File(path, "w") as f:
                f.attrs["lifeline_format"] = "lifeline-hdf5/1"
                fill(f)
            return path
        self.expect_error(h5("huge.h5", lambda f: f.create_dataset(
            "tensors/w", shape=(2 ** 40, 2 ** 40), dtype="f4", chunks=(1, 16))), "tensors/w")
        def mislabeled(f):
            f.create_dataset("tensors/w", data=np.zeros(4, "f4"))
            f["tensors/w"].attrs["lifeline_dtype"] = "bf16"
        self.expect_error(h5("mislabeled.h5", mislabeled), "tensors/w")
        self.expect_error(h5("complex.h5", lambda f: f.create_dataset("tensors/z", data=np.zeros(2, "c8"))), "tensors/z")
        def twice(f):
            f.create_dataset("tensors/a", data=np.zeros(2, "f4")).attrs["lifeline_name"] = "x"
            f.create_dataset("tensors/b", data=np.zeros(2, "f4")).attrs["lifeline_name"] = "x"
        self.expect_error(h5("twice.h5", twice), "'x'")
        good = h5("good.h5", lambda f: f.create_dataset("tensors/w", data=np.arange(100000, dtype="f4")))
        with open(good, "rb") as f:
            blob = f.read()
        truncated = os.path.join(self.tmp, "truncated.h5")
        with open(truncated, "wb") as f:
            f.write(blob[:len(blob) // 2])
        self.expect_error(truncated)
        junk = os.path.join(self.tmp, "junk.h5")
        with open(junk, "wb") as f:
            f.write(b"\x89HDF\r\n\x1a\n" + os.urandom(4096))
        self.expect_error(junk)


class ListAndCollectTest(unittest.TestCase):
    def test_ls_and_gc(self):
        tmp = tempfile.mkdtemp(prefix="lifeline-ls-", dir="/var/tmp")
        try:
            d = os.path.join(tmp, "D")
            run("bench", "save", "--dir", d, "--ranks", 2, "--state-bytes", "1MiB", "--hidden", 64, "--iterations", 3,
                "--keep-last", 0, "--no-baseline")
            # A partial step: one rank index of the newest step copied as an older step without the other.
            newest = sorted(n for n in os.listdir(d) if n.startswith("step-"))[-1]
            partial = os.path.join(d, "step-00000000000000000050")
            os.mkdir(partial)
            for n in os.listdir(os.path.join(d, newest)):
                if ".r000000-" in n:
                    shutil.copy(os.path.join(d, newest, n), partial)
            rc, j = run_json("ls", d)
            states = [(c["step"], c["state"]) for c in j["checkpoints"]]
            self.assertEqual(states, [(102, "complete"), (101, "complete"), (100, "complete"), (50, "partial")])
            self.assertTrue(all(c["bytes"] > 0 and c["location"] == "disk" for c in j["checkpoints"]))
            p = run("ls", d)
            self.assertIn("partial", p.stdout)
            rc, j = run_json("gc", d, "--keep", 1, "--dry-run")
            self.assertEqual(sorted(r["step"] for r in j["removed"]), [50, 100, 101])
            self.assertEqual(len([n for n in os.listdir(d) if n.startswith("step-")]), 4, "a dry run removes nothing")
            rc, j = run_json("gc", d, "--keep", 1)
            self.assertEqual(sorted(r["step"] for r in j["removed"]), [50, 100, 101])
            self.assertGreater(j["bytes_freed"], 0)
            rc, j = run_json("ls", d)
            self.assertEqual([(c["step"], c["state"]) for c in j["checkpoints"]], [(102, "complete")])
            rc, j = run_json("bench", "load", "--dir", d, "--ranks", 2)
            self.assertEqual(j["mismatches"], 0)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
