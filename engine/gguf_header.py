"""A GGUF file's header: its architecture and where each tensor lies, read without its metadata.

The gguf package's reader builds a numpy view for every metadata value, and a model's tokenizer is
metadata (49,152 strings in the default model): ~1.5-3 s a read, which every start on a GGUF file
paid several times. Here the metadata is walked with struct over the header's bytes and only the
architecture and the alignment are kept: a few ms. Layout (GGUF v2 and v3, little-endian): magic,
version, tensor and metadata counts, the metadata (key, type, value), the tensor infos (name, dims
innermost first, type, offset from the data section), then the data section at the alignment.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32
_STRING, _ARRAY = 8, 9
# metadata value type -> struct format of one value (strings and arrays are walked)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


@dataclass(frozen=True)
class GGUFTensor:
    """Where a tensor's bytes lie: shape innermost first (as the file and the gguf package give it),
    data_offset from the start of the file."""
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]
    data_offset: int
    n_bytes: int


class _Cursor:
    """Reads little-endian values off a buffer, refusing to run past its end."""

    def __init__(self, buffer) -> None:
        self.buffer, self.offset = buffer, 0

    def take(self, fmt: str):
        size = struct.calcsize("<" + fmt)
        if self.offset + size > len(self.buffer):
            raise ValueError("its header is truncated")
        values = struct.unpack_from("<" + fmt, self.buffer, self.offset)
        self.offset += size
        return values[0] if len(values) == 1 else values

    def string(self) -> str:
        length = self.take("Q")
        if self.offset + length > len(self.buffer):
            raise ValueError("its header is truncated")
        text = bytes(self.buffer[self.offset:self.offset + length]).decode("utf-8", errors="replace")
        self.offset += length
        return text

    def value(self, value_type: int):
        """One metadata value; an array's elements are skipped (None), as no array is needed here."""
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            element_type, count = self.take("I"), self.take("Q")
            if element_type in _SCALARS:  # fixed size: skipped at once
                self.offset += count * struct.calcsize(_SCALARS[element_type])
            else:
                for _ in range(count):
                    self.value(element_type)
            return None
        if value_type not in _SCALARS:
            raise ValueError(f"unknown metadata type {value_type}")
        return self.take(_SCALARS[value_type])


def read_gguf_header(path: Path) -> tuple[str, list[GGUFTensor]]:
    """(architecture, tensors) of the GGUF file at path; ValueError saying why it is not one we read."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
            return _parse(_Cursor(buffer), len(buffer))
    except (OSError, ValueError) as e:  # mmap refuses an empty file with ValueError too
        raise ValueError(f"cannot read the GGUF file {str(path)!r}: {e}") from None


def _parse(cursor: _Cursor, file_size: int) -> tuple[str, list[GGUFTensor]]:
    if bytes(cursor.buffer[:4]) != _MAGIC:
        raise ValueError("it does not start with GGUF")
    cursor.offset = 4
    version = cursor.take("I")
    if version not in (2, 3):
        raise ValueError(f"version {version} (GGUF v2 and v3, little-endian, are read)")
    num_tensors, num_values = cursor.take("QQ")
    architecture, alignment = None, _DEFAULT_ALIGNMENT
    for _ in range(num_values):
        key, value_type = cursor.string(), cursor.take("I")
        value = cursor.value(value_type)
        if key == "general.architecture":
            architecture = value
        elif key == "general.alignment":
            alignment = int(value)
    if not isinstance(architecture, str):
        raise ValueError("no general.architecture")
    infos = []
    for _ in range(num_tensors):
        name, num_dims = cursor.string(), cursor.take("I")
        shape = tuple(cursor.take("Q") for _ in range(num_dims))
        infos.append((name, shape, cursor.take("I"), cursor.take("Q")))
    data_start = -(-cursor.offset // alignment) * alignment
    tensors = []
    for name, shape, type_id, offset in infos:
        try:
            tensor_type = GGMLQuantizationType(type_id)
        except ValueError:
            raise ValueError(f"tensor {name} has unknown type {type_id}") from None
        block_size, type_size = GGML_QUANT_SIZES[tensor_type]
        num_values = 1
        for d in shape:
            num_values *= d
        tensor = GGUFTensor(name, tensor_type, shape, data_start + offset, num_values // block_size * type_size)
        if tensor.data_offset + tensor.n_bytes > file_size:
            raise ValueError(f"tensor {name} runs past its end")
        tensors.append(tensor)
    return architecture, tensors
