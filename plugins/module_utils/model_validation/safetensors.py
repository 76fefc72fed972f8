"""Reading safetensors headers (struct + json, never the weights) and the dtypes they name."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

# Bytes per element of each safetensors dtype (the format's own list).
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
DTYPE_NAMES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}
TORCH_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float64": 8}
# The safetensors reference implementation refuses headers above 100 MB.
MAX_HEADER_BYTES = 100_000_000


class SafetensorsError(ValueError):
    """A safetensors file that cannot be read; the message says why."""


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]
    nbytes: int

    @property
    def elements(self) -> int:
        return math.prod(self.shape)


def read_safetensors_header(path: str) -> dict[str, TensorInfo]:
    """The tensors a safetensors file declares, checked against the file's size.

    Reads the 8-byte little-endian header length and the JSON header only.
    Raises SafetensorsError for a short file, an unreadable header, offsets
    that do not match dtype x shape, or data past the end of the file (a copy
    that stopped early).
    """
    try:
        size = Path(path).stat().st_size
        with Path(path).open("rb") as file:
            prefix = file.read(8)
            if len(prefix) < 8:
                raise SafetensorsError(f"is {size} bytes, too short for a safetensors header")
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES or 8 + length > size:
                raise SafetensorsError(f"declares a {length}-byte header but the file is {size} bytes")
            raw = file.read(length)
    except OSError as error:
        raise SafetensorsError(f"cannot be read: {error.strerror}") from error
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise SafetensorsError(f"has a header that is not JSON ({error})") from error
    if not isinstance(header, dict):
        raise SafetensorsError("has a header that is not a JSON object")
    data_size = size - 8 - length
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = str(entry["dtype"])
            shape = tuple(int(dim) for dim in entry["shape"])
            begin, end = (int(offset) for offset in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as error:
            raise SafetensorsError(f"has a malformed entry for tensor {name}") from error
        if not 0 <= begin <= end:
            raise SafetensorsError(f"has invalid offsets [{begin}, {end}] for tensor {name}")
        nbytes = end - begin
        width = DTYPE_BYTES.get(dtype)
        if width is not None and nbytes != math.prod(shape) * width:
            raise SafetensorsError(
                f"declares tensor {name} as {dtype} {list(shape)} ({math.prod(shape) * width} bytes)"
                f" but gives it {nbytes} bytes"
            )
        if end > data_size:
            raise SafetensorsError(
                f"is truncated: tensor {name} ends at data byte {end} but the file holds {data_size}"
            )
        tensors[str(name)] = TensorInfo(dtype=dtype, shape=shape, nbytes=nbytes)
    return tensors
