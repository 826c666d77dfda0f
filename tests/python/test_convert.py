"""lifeline.convert() and lifeline.describe_source(): the library's conversions from Python.

A checkpoint saved through lifeline.Checkpointer goes to safetensors (checked with a reader written
here), to HDF5 (checked with h5py when it is installed) and back to a checkpoint that a Checkpointer
loads element for element. Failures raise lifeline.Error with the code and leave nothing behind.

Run by ctest: /usr/bin/python3 test_convert.py.
"""

import json
import os
import shutil
import struct
import tempfile
import unittest

import numpy as np
import torch

import lifeline

try:
    import h5py
except ImportError:  # python3-h5py is optional for this test
    h5py = None


def read_safetensors(path):
    """{name: numpy array} and the metadata of a safetensors file, by the published layout."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    metadata = header.pop("__metadata__", {})
    dtypes = {"F32": np.float32, "I64": np.int64}
    out = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        raw = data[8 + n + begin:8 + n + end]
        out[name] = np.frombuffer(raw, dtype=dtypes[entry["dtype"]]).reshape(entry["shape"])
    return out, metadata


class ConvertTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="lifeline-py-convert-")
        self.ckpt = os.path.join(self.dir, "ckpt")
        self.state = {
            "w": torch.arange(24, dtype=torch.float32).reshape(6, 4),
            "b": torch.arange(3, dtype=torch.int64) * 7,
        }
        with lifeline.Checkpointer(self.ckpt, rank=0, world_size=1) as ckpt:
            ckpt.save(42, self.state).wait()

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_describe_source_lists_tensors_without_reading_them(self):
        info = lifeline.describe_source(self.ckpt)
        self.assertEqual(info["format"], "lifeline")
        self.assertEqual(info["step"], 42)
        self.assertEqual(info["saved_world_size"], 1)
        tensors = {t["name"]: t for t in info["tensors"]}
        self.assertEqual(tensors["w"]["dtype"], "f32")
        self.assertEqual(tensors["w"]["shape"], (6, 4))
        self.assertEqual(tensors["b"]["shape"], (3,))
        with self.assertRaises(lifeline.Error) as e:
            lifeline.describe_source(self.ckpt, step=7)
        self.assertEqual(e.exception.code, "NotFound")

    def test_safetensors_and_back_to_a_checkpoint(self):
        out = os.path.join(self.dir, "model.safetensors")
        report = lifeline.convert(self.ckpt, out, to="safetensors")
        self.assertEqual(report["source_format"], "lifeline")
        self.assertEqual(report["tensors"], 2)
        self.assertEqual(report["outputs"], [out])
        tensors, metadata = read_safetensors(out)
        np.testing.assert_array_equal(tensors["w"], self.state["w"].numpy())
        np.testing.assert_array_equal(tensors["b"], self.state["b"].numpy())
        self.assertEqual(metadata["lifeline_step"], "42")

        back = os.path.join(self.dir, "back")
        report = lifeline.convert(out, back, to="lifeline", ranks=2, tp=2, out_step=7, codec="zstd")
        self.assertEqual((report["step"], report["ranks"], report["tp"], report["dp"]), (7, 2, 2, 1))
        target = {"w": torch.zeros(6, 4), "b": torch.zeros(3, dtype=torch.int64)}
        with lifeline.Checkpointer(back, rank=0, world_size=1) as ckpt:
            self.assertEqual(ckpt.load(target), 7)
        self.assertTrue(torch.equal(target["w"], self.state["w"]))
        self.assertTrue(torch.equal(target["b"], self.state["b"]))

    def test_select_and_shards(self):
        out = os.path.join(self.dir, "shards")
        report = lifeline.convert(self.ckpt, out, "safetensors", max_shard_bytes=96, select=["w", "b"])
        self.assertEqual([os.path.basename(p) for p in report["outputs"]],
                         ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                          "model.safetensors.index.json"])
        only_w = os.path.join(self.dir, "w.safetensors")
        lifeline.convert(self.ckpt, only_w, "safetensors", select="w")
        self.assertEqual(sorted(read_safetensors(only_w)[0]), ["w"])

    @unittest.skipIf(h5py is None, "python3-h5py is not installed")
    def test_hdf5_is_readable_by_h5py(self):
        out = os.path.join(self.dir, "model.h5")
        report = lifeline.convert(self.ckpt, out, to="hdf5", deflate=3)
        self.assertEqual(report["format"], "hdf5")
        with h5py.File(out, "r") as f:
            np.testing.assert_array_equal(f["tensors/w"][()], self.state["w"].numpy())
            self.assertEqual(f.attrs["lifeline_step"], "42")

    def test_failures_raise_and_leave_nothing(self):
        out = os.path.join(self.dir, "taken.safetensors")
        with open(out, "wb") as f:
            f.write(b"mine")
        with self.assertRaises(lifeline.Error) as e:
            lifeline.convert(self.ckpt, out, to="safetensors")
        self.assertEqual(e.exception.code, "AlreadyExists")
        self.assertIn(out, str(e.exception))
        with open(out, "rb") as f:
            self.assertEqual(f.read(), b"mine")
        self.assertEqual(sorted(os.listdir(self.dir)), ["ckpt", "taken.safetensors"])
        lifeline.convert(self.ckpt, out, to="safetensors", force=True)
        self.assertEqual(sorted(read_safetensors(out)[0]), ["b", "w"])

        with self.assertRaises(ValueError):
            lifeline.convert(self.ckpt, out, to="npz")
        with self.assertRaises(TypeError):
            lifeline.convert(self.ckpt, out, to="safetensors", no_such_option=1)
        with self.assertRaises(lifeline.Error) as e:
            lifeline.convert(os.path.join(self.dir, "missing"), out, to="hdf5")
        self.assertEqual(e.exception.code, "NotFound")


if __name__ == "__main__":
    unittest.main()
