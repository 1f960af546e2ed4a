"""One safetensors file read with plain reads: each tensor's bytes land once, in the tensor that keeps them.

safetensors' own reader maps the whole file, and every page it touches counts in the process's resident memory
until the map closes, so loading a checkpoint peaked at twice its size; here the page cache holds the file (not
the process) and the peak is the weights themselves. The format: an 8-byte little-endian header length, a JSON
header {name: {dtype, shape, data_offsets [begin, end)}} (and __metadata__), then the data.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from freetoken import hugepages

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64, "F8_E8M0": torch.float8_e8m0fnu,
}
if hasattr(torch, "float8_e8m0fnu"):  # MX block scales (torch >= 2.7)
    DTYPES["F8_E8M0"] = torch.float8_e8m0fnu
MAX_HEADER = 100 << 20


class ShardError(ValueError):
    pass


class Shard:
    def __init__(self, file: Path):
        self.file = Path(file)
        try:
            size = self.file.stat().st_size
            with open(self.file, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                if not 0 < n <= min(MAX_HEADER, size - 8):
                    raise ShardError(f"header length {n} does not fit the file's {size} bytes")
                header = json.loads(f.read(n))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ShardError(str(e)) from None
        if not isinstance(header, dict):
            raise ShardError("the header is not a JSON object")
        header.pop("__metadata__", None)
        self.base, self.size = 8 + n, size
        self.entries: dict[str, tuple[torch.dtype, tuple[int, ...], int, int]] = {}
        for name, e in header.items():
            try:
                dtype, shape, (begin, end) = e["dtype"], tuple(int(d) for d in e["shape"]), e["data_offsets"]
            except (KeyError, TypeError, ValueError):
                raise ShardError(f"tensor {name!r}: bad header entry {e!r}") from None
            if dtype not in DTYPES:  # a dtype this reader does not map (sub-byte floats): safetensors reads it
                self.entries[name] = (dtype, shape, begin, end)
                continue
            dtype = DTYPES[dtype]
            nbytes = math.prod(shape) * dtype.itemsize
            if end - begin != nbytes or begin < 0 or self.base + end > size:
                raise ShardError(f"tensor {name!r}: {nbytes} bytes of {e['dtype']} {list(shape)} do not match the "
                                 f"offsets [{begin}, {end}) of a {size}-byte file")
            self.entries[name] = (dtype, shape, begin, end)

    def keys(self):
        return self.entries.keys()

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name][1]

    def read(self, name: str) -> torch.Tensor:
        dtype, shape, begin, end = self.entries[name]
        if isinstance(dtype, str):
            from safetensors import safe_open

            with safe_open(str(self.file), framework="pt") as f:
                return f.get_tensor(name).clone()
        return self.read_into(name, hugepages.empty(shape, dtype))  # the host kernels stream large tensors

    def read_into(self, name: str, out: torch.Tensor) -> torch.Tensor:
        """The tensor's bytes straight into `out` (contiguous, of its dtype and element count: the caller's check),
        such as an expert's rows in its layer's stack."""
        _, _, begin, end = self.entries[name]
        if end > begin:
            view = memoryview(out.view(-1).view(torch.uint8).numpy())
            fd = os.open(self.file, os.O_RDONLY)
            try:
                got = 0
                while got < end - begin:  # preadv may return short on huge reads
                    n = os.preadv(fd, [view[got:]], self.base + begin + got)
                    if n <= 0:
                        break
                    got += n
            finally:
                os.close(fd)
            if got != end - begin:
                raise ShardError(f"tensor {name!r}: read {got} of {end - begin} bytes (truncated file?)")
        return out

