#!/usr/bin/env python3
"""Half-precision interop between torch, numpy and rmsgrad (TestTorchInterop).

  torch_interop.py write DIR      torch writes BF16/F16/F32 inputs as
                                  safetensors files (the header built by hand:
                                  Debian has no safetensors package)
  torch_interop.py check IN OUT   numpy reads rmsgrad's output OUT (BF16 read
                                  as uint16 and shifted: numpy has no bf16)
                                  and compares it with torch's float64
                                  autograd of RMSNorm on IN's values

The bound (as compute/computetest.CompareRounded argues): rmsgrad computes
in float32, within e32 = Tolerance(k) * scale of the exact value (k the
longest sum, scale the size of the output's terms), then rounds once to the
output dtype, which moves it by at most half an ULP of that dtype. So every
element must satisfy |got - want| <= ULP(max(|got|, |want|)) + e32; one
rounding of a half output, and e32 where a result cancels.
"""
import hashlib
import json
import math
import struct
import sys

import numpy as np
import torch

EPS = 1e-5
DT = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
# (file, shape, dtypes of x, w, dy)
CASES = [
    ("bf16", (4, 6, 256), ("BF16", "BF16", "BF16")),
    ("f16", (33, 96), ("F16", "F16", "F16")),
    ("mixed", (2, 8, 100), ("BF16", "F32", "BF16")),
]


def raw(t):
    """The little-endian bytes of a tensor, bf16 included."""
    t = t.contiguous()
    if t.dtype == torch.float32:
        return t.numpy().astype("<f4").tobytes()
    return t.view(torch.int16).numpy().astype("<i2").tobytes()


def write_safetensors(path, tensors):
    header, off, blobs = {}, 0, []
    for name, dtype, t in tensors:
        b = raw(t)
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def read_header(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def to_numpy(entry, body):
    """numpy float64 values of one tensor: F32 and F16 natively, BF16 as
    uint16 shifted into the top half of a float32."""
    b, e = entry["data_offsets"]
    raw_ = body[b:e]
    dt = entry["dtype"]
    if dt == "F32":
        a = np.frombuffer(raw_, dtype="<f4")
    elif dt == "F16":
        a = np.frombuffer(raw_, dtype="<f2")
    elif dt == "BF16":
        a = (np.frombuffer(raw_, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        raise SystemExit(f"unexpected dtype {dt}")
    return a.astype(np.float64).reshape(entry["shape"])


def write(d):
    g = torch.Generator().manual_seed(21)
    for name, shape, (tx, tw, tdy) in CASES:
        x = (torch.randn(shape, generator=g) * 2).to(DT[tx])
        w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(DT[tw])
        dy = (torch.randn(shape, generator=g) * 0.5).to(DT[tdy])
        write_safetensors(f"{d}/{name}.safetensors", [("x", tx, x), ("w", tw, w), ("dy", tdy, dy)])
    print("ok")


def ulp(v, dt):
    """Spacing of dt's values at |v| (the subnormal spacing below its
    normal range)."""
    p, emin = {"F32": (24, -126), "BF16": (8, -126), "F16": (11, -14)}[dt]
    a = np.maximum(np.abs(v), np.ldexp(1.0, emin))
    e = np.floor(np.log2(a))
    return np.ldexp(1.0, (e - (p - 1)).astype(int))


def tolerance(k):
    u = 2.0 ** -24
    return 8 * u * math.sqrt(k) + 16 * u


def check(inp, out, want_dx, want_dw):
    hin, bin_ = read_header(inp)
    x, w, dy = (torch.from_numpy(to_numpy(hin[n], bin_)) for n in ("x", "w", "dy"))
    dim = x.shape[-1]
    rows = x.numel() // dim
    # torch float64 autograd of RMSNorm on the upcast values.
    xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
    r = torch.rsqrt(xe.pow(2).mean(-1, keepdim=True) + EPS)
    y = xe * r * we
    gx, gw = torch.autograd.grad(y, (xe, we), dy)
    gx, gw, r = gx.numpy(), gw.numpy(), r.detach().numpy()
    # dx's scale: its two terms, r*dy*w and r*x*c (as CompareDX).
    s = (dy * x * w).sum(-1, keepdim=True).numpy()
    t1 = np.abs(r * dy.numpy() * w.numpy())
    t2 = np.abs(r * x.numpy() * (s * r * r / dim))
    scales = {"dx": max(t1.max(), t2.max()), "dw": np.abs(gw).max(), "r": np.abs(r).max()}
    hout, bout = read_header(out)
    meta = hout.pop("__metadata__")
    want_dt = {"dx": want_dx, "dw": want_dw, "r": "F32"}
    e32 = tolerance(max(rows, dim))
    for name, want in (("dx", gx), ("dw", gw), ("r", r.reshape(-1))):
        ent = hout[name]
        assert ent["dtype"] == want_dt[name], (name, ent["dtype"], want_dt[name])
        b, e = ent["data_offsets"]
        assert meta["sha256." + name] == hashlib.sha256(bout[b:e]).hexdigest(), name
        got = to_numpy(ent, bout)
        assert list(got.shape) == list(want.shape), (name, got.shape, want.shape)
        tol = ulp(np.maximum(np.abs(got), np.abs(want)), ent["dtype"]) + e32 * scales[name]
        bad = np.abs(got - want) > tol
        if bad.any():
            i = np.flatnonzero(bad.reshape(-1))[0]
            raise SystemExit(f"{name} ({ent['dtype']}) element {i}: rmsgrad {got.reshape(-1)[i]!r}, torch float64 {want.reshape(-1)[i]!r}, tolerance {tol.reshape(-1)[i]:.3g}")
        print(f"{name} {ent['dtype']}: {got.size} values within one rounding of torch's float64 autograd "
              f"(max |diff| {np.abs(got - want).max():.3g}, e32 {e32 * scales[name]:.3g})")
    print("ok")


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2])
    elif sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
    else:
        raise SystemExit(__doc__)
