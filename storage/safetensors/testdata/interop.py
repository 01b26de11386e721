#!/usr/bin/env python3
"""safetensors interop with a hand-built header (numpy only, no pip package).

  interop.py write PATH   writes x (F32 [3,4]), w (F32 [4]) and meta
  interop.py check PATH   loads a file written by rmsgrad and checks its
                          values, shapes and sha256 metadata
"""
import hashlib, json, struct, sys
import numpy as np

def write(path):
    x = (np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5) / 3
    w = np.array([1.0, -2.0, 0.5, 1e-30], dtype=np.float32)
    tensors = [("x", x), ("w", w)]
    header, off = {"__metadata__": {"producer": "numpy"}}, 0
    for name, a in tensors:
        n = a.nbytes
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, a in tensors:
            f.write(a.astype("<f4").tobytes())

def check(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__")
    data = raw[8 + n:]
    want = {"dx": (np.arange(6, dtype=np.float32).reshape(2, 3) * 0.25 - 1), "dw": np.array([3.5, -0.125], dtype=np.float32)}
    assert set(header) == set(want), header
    for name, a in want.items():
        e = header[name]
        assert e["dtype"] == "F32" and e["shape"] == list(a.shape), e
        b, end = e["data_offsets"]
        got = np.frombuffer(data[b:end], dtype="<f4").reshape(a.shape)
        assert np.array_equal(got, a), (name, got, a)
        assert meta["sha256." + name] == hashlib.sha256(data[b:end]).hexdigest(), name
    assert meta["job"] == "interop", meta
    print("ok")

{"write": write, "check": check}[sys.argv[1]](sys.argv[2])
