"""Unit tests of the codec and the dtype conversions (no server)."""

import struct
import unittest

from rmsgrad.safetensors import FormatError, RawTensor, decode, encode

try:
    import numpy as np
except ImportError:  # pragma: no cover
    np = None
try:
    import torch
except ImportError:  # pragma: no cover
    torch = None


class CodecTest(unittest.TestCase):
    def test_roundtrip_stdlib(self):
        a = RawTensor("F32", (2, 3), struct.pack("<6f", *range(6)))
        b = RawTensor("BF16", (3,), b"\x80\x3f\x00\x40\x40\x40")
        buf = encode({"a": a, "b": b}, {"k": "v"})
        (n,) = struct.unpack_from("<Q", buf)
        self.assertEqual((8 + n) % 8, 0, "data starts 8-byte aligned")
        got, meta = decode(buf)
        self.assertEqual(got, {"a": a, "b": b})
        self.assertEqual(list(got), ["a", "b"])
        self.assertEqual(meta, {"k": "v"})

    def test_rejects(self):
        with self.assertRaisesRegex(ValueError, "needs 24 bytes, got 4"):
            RawTensor("F32", (2, 3), b"\0" * 4)
        with self.assertRaisesRegex(ValueError, "dtype 'F7'"):
            RawTensor("F7", (1,), b"\0")
        with self.assertRaises(FormatError):
            decode(b"\x10\0\0\0\0\0\0\0{}")
        with self.assertRaises(FormatError):
            decode(struct.pack("<Q", 2) + b"[]")


class StdlibOnlyTest(unittest.TestCase):
    def test_core_needs_no_numpy_or_torch(self):
        import os
        import subprocess
        import sys

        code = (
            "import sys; sys.modules['numpy'] = None; sys.modules['torch'] = None\n"
            "import struct, rmsgrad\n"
            "from rmsgrad.safetensors import encode, decode\n"
            "from rmsgrad.client import _default_kind\n"
            "t = rmsgrad.RawTensor('F32', (2,), struct.pack('<2f', 1, 2))\n"
            "assert decode(encode({'x': t}))[0]['x'] == t\n"
            "assert _default_kind() == 'raw'\n"
            "rmsgrad.Client('http://127.0.0.1:9').close()\n"
        )
        root = os.path.join(os.path.dirname(__file__), "..")
        r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": root})
        self.assertEqual(r.returncode, 0, r.stderr)


@unittest.skipIf(np is None, "numpy not installed")
class NumpyTest(unittest.TestCase):
    def test_dtypes(self):
        from rmsgrad.arrays import from_raw, to_raw

        for dt, st in [(np.float32, "F32"), (np.float16, "F16"), (np.float64, "F64")]:
            a = (np.arange(12, dtype=np.float64).reshape(3, 4) / 7).astype(dt)
            t = to_raw(a)
            self.assertEqual(t.dtype, st)
            self.assertEqual(t.shape, (3, 4))
            self.assertEqual(t.data, a.astype(a.dtype.newbyteorder("<")).tobytes())
            back = from_raw(t)
            self.assertEqual(back.dtype, a.dtype)
            np.testing.assert_array_equal(back, a)
        big = np.arange(4, dtype=">f4")
        self.assertEqual(to_raw(big).data, np.arange(4, dtype="<f4").tobytes(), "big-endian arrays are written little-endian")
        # A transposed (non-contiguous) array is written in its logical order.
        m = np.arange(6, dtype=np.float32).reshape(2, 3).T
        self.assertEqual(to_raw(m).data, np.ascontiguousarray(m).tobytes())


@unittest.skipIf(torch is None, "torch not installed")
class TorchTest(unittest.TestCase):
    def test_bf16_bits(self):
        from rmsgrad.arrays import from_raw, to_raw

        x = torch.tensor([[1.0, -2.5, 3.140625], [0.0, 65280.0, -1e-3]], dtype=torch.bfloat16)
        t = to_raw(x)
        self.assertEqual(t.dtype, "BF16")
        self.assertEqual(t.shape, (2, 3))
        want = struct.pack("<6H", *[v & 0xFFFF for v in x.view(torch.int16).flatten().tolist()])
        self.assertEqual(t.data, want, "BF16 bytes are torch's own bits, little-endian")
        back = from_raw(t, "torch")
        self.assertEqual(back.dtype, torch.bfloat16)
        self.assertTrue(torch.equal(back, x))
        f = from_raw(t, "numpy")
        self.assertEqual(str(f.dtype), "float32")
        self.assertTrue(torch.equal(torch.from_numpy(f), x.float()))

    def test_f32_f16_and_grad(self):
        from rmsgrad.arrays import from_raw, to_raw

        for dt, st in [(torch.float32, "F32"), (torch.float16, "F16")]:
            x = torch.randn(4, 5, dtype=dt, requires_grad=True)
            t = to_raw(x)
            self.assertEqual(t.dtype, st)
            self.assertTrue(torch.equal(from_raw(t, "torch"), x.detach()))


if __name__ == "__main__":
    unittest.main()
