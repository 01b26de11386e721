"""Conversions between numpy arrays / torch tensors and :class:`RawTensor`.

numpy and torch are optional: each is imported only when a value of its kind
is seen (or asked for). The safetensors dtype string comes from the array's
dtype, so float32, float16 and bfloat16 (torch, or numpy through ml_dtypes)
all travel as themselves: ``F32``, ``F16``, ``BF16``.
"""

from __future__ import annotations

import sys
from typing import Any

from .safetensors import RawTensor

__all__ = ["to_raw", "from_raw", "kind_of"]

# numpy dtype name -> safetensors dtype
_NUMPY = {
    "float32": "F32", "float16": "F16", "float64": "F64", "bfloat16": "BF16",
    "int8": "I8", "uint8": "U8", "int16": "I16", "uint16": "U16",
    "int32": "I32", "uint32": "U32", "int64": "I64", "uint64": "U64", "bool": "BOOL",
}
_NUMPY_BACK = {v: k for k, v in _NUMPY.items() if k != "bfloat16"}

# torch dtype name (str(torch.float32) without "torch.") -> safetensors dtype
_TORCH = {
    "float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
    "int8": "I8", "uint8": "U8", "int16": "I16", "int32": "I32", "int64": "I64", "bool": "BOOL",
}
_TORCH_BACK = {v: k for k, v in _TORCH.items()}


def kind_of(v: Any) -> str:
    """Return "torch", "numpy" or "raw" for a tensor value."""
    if isinstance(v, RawTensor):
        return "raw"
    mod = type(v).__module__
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith("numpy"):
        return "numpy"
    raise TypeError(f"{type(v).__name__}: want a numpy array, a torch tensor or a RawTensor")


def to_raw(v: Any, what: str = "tensor") -> RawTensor:
    """Convert a numpy array, a torch tensor or a RawTensor to a RawTensor."""
    kind = kind_of(v)
    if kind == "raw":
        return v
    if kind == "torch":
        import torch  # noqa: F401  (the value is one of its tensors)

        name = str(v.dtype).removeprefix("torch.")
        dtype = _TORCH.get(name)
        if dtype is None:
            raise TypeError(f"{what}: torch dtype {v.dtype} has no safetensors dtype here (use {', '.join(_TORCH)})")
        t = v.detach().to("cpu").contiguous()
        if name == "bfloat16":
            # numpy has no bfloat16: move the same 16 bits as int16.
            t = t.view(__import__("torch").int16)
        arr = t.numpy()
        return RawTensor(dtype, tuple(int(d) for d in v.shape), _le_bytes(arr))
    import numpy as np

    arr = np.asarray(v)
    dtype = _NUMPY.get(arr.dtype.name)
    if dtype is None:
        raise TypeError(f"{what}: numpy dtype {arr.dtype} has no safetensors dtype here (use {', '.join(_NUMPY)})")
    return RawTensor(dtype, tuple(int(d) for d in arr.shape), _le_bytes(arr))


def _le_bytes(arr: Any) -> bytes:
    import numpy as np

    a = np.ascontiguousarray(arr)
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and sys.byteorder == "big"):
        a = a.byteswap().view(a.dtype.newbyteorder("<"))
    return a.tobytes()


def from_raw(t: RawTensor, kind: str = "numpy") -> Any:
    """Convert a RawTensor to a numpy array ("numpy"), a torch tensor
    ("torch") or leave it ("raw").

    BF16 becomes a torch.bfloat16 tensor, or for numpy float32 (exact: every
    bfloat16 is a float32), since numpy has no bfloat16 of its own.
    """
    if kind == "raw":
        return t
    import numpy as np

    if t.dtype == "BF16":
        bits = np.frombuffer(t.data, dtype="<u2").astype(np.uint32) << 16
        f32 = bits.view(np.float32).reshape(t.shape)
        if kind == "torch":
            import torch

            return torch.from_numpy(f32.copy()).to(torch.bfloat16)
        return f32.copy()
    name = _NUMPY_BACK.get(t.dtype)
    if name is None:
        raise TypeError(f"dtype {t.dtype} has no numpy dtype")
    arr = np.frombuffer(t.data, dtype=np.dtype(name).newbyteorder("<")).reshape(t.shape)
    arr = arr.astype(np.dtype(name), copy=True)  # native order, writable
    if kind == "torch":
        import torch

        return torch.from_numpy(arr)
    return arr

