"""The tensors of a GGUF file, read without building its metadata: what the loaders take from it.

gguf's `GGUFReader` turns every metadata value into numpy views before it reaches the tensor table (a tokenizer's
49,152 strings and merges: about 3.5 s for SmolLM2-135M's file on a 2-core Xeon, 12 s for qwen2.5-coder-1.5B's).
Here the header is read, the metadata stepped over, and each tensor's bytes mapped as `GGUFReader` maps them: the
same names, types, dimensions and `data` arrays (tests/test_gguf_tensors.py compares the two on a real file and on
written ones).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from specviz.errors import SpecvizError

if TYPE_CHECKING:
    import gguf

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9  # GGUF's value types with a length (gguf.GGUFValueType); the rest are fixed in size
# tensor types stored as numpy numbers (GGUFReader's `data` is typed for these); every other type is blocks of bytes
TYPED = {name: np.dtype(t) for name, t in (("F16", np.float16), ("F32", np.float32), ("F64", np.float64),
                                            ("I8", np.int8), ("I16", np.int16), ("I32", np.int32), ("I64", np.int64))}


@dataclass(frozen=True)
class Tensor:
    name: str
    tensor_type: gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF's dimensions, the fastest-varying first (GGUFReader's `shape`)
    data: np.ndarray  # the bytes as GGUFReader's `data`: typed for float and integer tensors, else uint8 rows


class _Cursor:
    def __init__(self, buffer: memoryview, sizes: dict[int, int]) -> None:
        self.buffer, self.at, self.sizes = buffer, 0, sizes

    def take(self, form: str) -> tuple:
        values = struct.unpack_from("<" + form, self.buffer, self.at)
        self.at += struct.calcsize("<" + form)
        return values

    def string(self) -> bytes:
        (length,) = self.take("Q")
        text = bytes(self.buffer[self.at : self.at + length])
        self.at += length
        return text

    def skip_value(self, kind: int) -> None:
        if kind in self.sizes:
            self.at += self.sizes[kind]
        elif kind == STRING:
            (length,) = self.take("Q")
            self.at += length
        elif kind == ARRAY:
            element, count = self.take("IQ")
            if element in self.sizes:
                self.at += self.sizes[element] * count
            else:
                for _ in range(count):
                    self.skip_value(element)
        else:
            raise SpecvizError(f"unknown GGUF value type {kind}")


def tensors(path: Path | str) -> list[Tensor]:
    """Every tensor of the GGUF at `path`, in the file's order, its bytes mapped read-only from the file."""
    import gguf

    if Path(path).stat().st_size < len(MAGIC):
        raise SpecvizError(f"{path} is not a GGUF file (no GGUF magic)")
    data = np.memmap(path, mode="r")
    # the size of each fixed-size value type, as gguf's reader maps them to numpy; strings and arrays have a length
    sizes = {int(kind): np.dtype(scalar).itemsize for kind, scalar in gguf.GGUFReader.gguf_scalar_to_np.items()}
    cursor = _Cursor(memoryview(data), sizes)
    try:
        if bytes(cursor.buffer[:4]) != MAGIC:
            raise SpecvizError(f"{path} is not a GGUF file (no GGUF magic)")
        cursor.at = 4
        (version,) = cursor.take("I")
        if version not in VERSIONS:
            raise SpecvizError(f"{path}: GGUF version {version} (little-endian 2 or 3 expected)")
        tensor_count, kv_count = cursor.take("QQ")
        alignment = DEFAULT_ALIGNMENT
        for _ in range(kv_count):
            key = cursor.string()
            (kind,) = cursor.take("I")
            if key == b"general.alignment" and kind == gguf.GGUFValueType.UINT32:
                (alignment,) = cursor.take("I")
            else:
                cursor.skip_value(kind)
        table = []
        for _ in range(tensor_count):
            name = cursor.string().decode()
            (n_dims,) = cursor.take("I")
            dims = cursor.take(f"{n_dims}Q")
            kind, offset = cursor.take("IQ")
            table.append((name, dims, kind, offset))
    except struct.error as e:
        raise SpecvizError(f"{path} is cut short: its GGUF header ends inside its metadata or tensor table") from e
    start = -(-cursor.at // alignment) * alignment
    out = []
    for name, dims, kind, offset in table:
        tensor_type = gguf.GGMLQuantizationType(kind)
        shape = tuple(reversed(dims))  # numpy's order: the slowest-varying first
        typed = TYPED.get(tensor_type.name)
        if typed is not None:
            item_type, count = typed, int(np.prod(dims))
        else:
            block_size, type_size = gguf.GGML_QUANT_SIZES[tensor_type]
            item_type, count = np.dtype(np.uint8), int(np.prod(dims)) * type_size // block_size
            shape = gguf.quants.quant_shape_to_byte_shape(shape, tensor_type)
        begin = start + offset
        if begin + count * item_type.itemsize > len(data):
            raise SpecvizError(f"{path} is cut short: tensor {name} ends past the end of the file")
        array = data[begin : begin + count * item_type.itemsize].view(item_type).reshape(shape)
        out.append(Tensor(name, tensor_type, tuple(dims), array))
    return out
