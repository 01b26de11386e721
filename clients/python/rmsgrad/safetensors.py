"""A small safetensors codec on the standard library.

Tensors are :class:`RawTensor` values (dtype string, shape, little-endian
bytes); :mod:`rmsgrad.arrays` converts numpy arrays and torch tensors to and
from them. The format: an 8-byte little-endian header length, a JSON header
naming each tensor's dtype, shape and byte range, then the data.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

__all__ = ["RawTensor", "DTYPE_SIZES", "encode", "decode", "FormatError"]

#: Element size in bytes of each safetensors dtype this codec handles.
DTYPE_SIZES: Dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}

#: The safetensors header may be at most this long (the reference
#: implementation's cap).
MAX_HEADER = 100_000_000


class FormatError(ValueError):
    """The bytes are not a well-formed safetensors file."""


@dataclass(frozen=True)
class RawTensor:
    """One tensor as safetensors stores it.

    ``data`` holds ``prod(shape)`` little-endian elements of ``dtype``
    (a safetensors dtype string such as ``"F32"``, ``"BF16"``, ``"F16"``).
    """

    dtype: str
    shape: Tuple[int, ...]
    data: bytes

    def __post_init__(self) -> None:
        size = DTYPE_SIZES.get(self.dtype)
        if size is None:
            raise ValueError(f"dtype {self.dtype!r}: want one of {', '.join(sorted(DTYPE_SIZES))}")
        if any((not isinstance(d, int)) or d < 0 for d in self.shape):
            raise ValueError(f"shape {self.shape!r}: want non-negative integers")
        want = math.prod(self.shape) * size
        if len(self.data) != want:
            raise ValueError(f"{self.dtype} tensor of shape {list(self.shape)} needs {want} bytes, got {len(self.data)}")

    @property
    def numel(self) -> int:
        """The number of elements."""
        return math.prod(self.shape)


def encode(tensors: Mapping[str, RawTensor], metadata: Optional[Mapping[str, str]] = None) -> bytes:
    """Encode ``tensors`` (in the mapping's order) as one safetensors file."""
    header: Dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    off = 0
    for name, t in tensors.items():
        if name == "__metadata__" or not name:
            raise ValueError(f"tensor name {name!r} is reserved or empty")
        header[name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [off, off + len(t.data)]}
        off += len(t.data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)  # the data starts 8-byte aligned
    parts: List[bytes] = [struct.pack("<Q", len(h)), h]
    parts.extend(t.data for t in tensors.values())
    return b"".join(parts)


def decode(buf: bytes) -> Tuple[Dict[str, RawTensor], Dict[str, str]]:
    """Decode a safetensors file into its tensors (in data order) and metadata."""
    if len(buf) < 8:
        raise FormatError(f"{len(buf)} bytes: shorter than the 8-byte header length")
    (n,) = struct.unpack_from("<Q", buf)
    if n > MAX_HEADER or 8 + n > len(buf):
        raise FormatError(f"header length {n} does not fit the {len(buf)}-byte file")
    try:
        header = json.loads(buf[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise FormatError("header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    data = memoryview(buf)[8 + n :]
    entries = []
    for name, e in header.items():
        try:
            dtype, shape, (begin, end) = e["dtype"], tuple(e["shape"]), e["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise FormatError(f"tensor {name!r}: want dtype, shape and data_offsets") from None
        if not (0 <= begin <= end <= len(data)):
            raise FormatError(f"tensor {name!r}: data_offsets [{begin}, {end}] outside the {len(data)}-byte data")
        entries.append((begin, end, name, dtype, shape))
    entries.sort()
    out: Dict[str, RawTensor] = {}
    for begin, end, name, dtype, shape in entries:
        try:
            out[name] = RawTensor(dtype, shape, bytes(data[begin:end]))
        except ValueError as e:
            raise FormatError(f"tensor {name!r}: {e}") from None
    return out, {str(k): str(v) for k, v in meta.items()}

