"""Reading a Hugging Face folder's safetensors into a model's parameters.

Memory: the model is built on the meta device and given empty storage in the served dtype
(engine/worker/model_runner.py), so the parameters exist once. Each checkpoint tensor is read with
plain file reads straight into its parameter when the dtypes agree (a bf16 checkpoint served in
bf16), else into one temporary tensor that is cast into the parameter and dropped: peak memory is
the weights plus the largest single tensor, never an fp32 copy of the model. Reading instead of
memory-mapping keeps the file's pages out of the process's resident memory (a mapped shard's
pages count there until it is closed: loading a 1.5B-parameter bf16 model in 650 MB shards
peaked at 1.39x the weights' bytes mapped, 1.15x read, the Python process itself included).

Checkpoints store q/k/v and gate/up separately (most families) or already fused (Phi-3); the
model holds them fused (`qkv_proj`, `gate_up_proj`), so separate parts are copied into their rows.
"""
from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

# safetensors dtype names -> torch dtypes
_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}

# checkpoint part -> (fused parameter, index of the part in it)
_FUSED_PARTS = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
                "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


def safetensors_files(model_dir: Path) -> list[Path]:
    """The shards the index names (a folder may hold other copies, e.g. consolidated.safetensors),
    else every *.safetensors file; ValueError when there are none."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({model_dir / name for name in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"{model_dir} is missing the shards its index names: {missing[:3]}")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {model_dir}")
    return files


@dataclass(frozen=True)
class _Entry:
    """One tensor of a safetensors file."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # byte offset in the file
    num_bytes: int


def _entries(file: Path) -> Iterator[_Entry]:
    """The tensors a safetensors file holds, from its header (8-byte little-endian length, then JSON)."""
    with file.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        try:
            header = json.loads(f.read(header_len))
        except ValueError as e:
            raise ValueError(f"{file} is not a safetensors file: {e}") from None
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise ValueError(f"{file}: tensor {name} has dtype {info.get('dtype')}, which Formwork does not read")
        begin, end = info["data_offsets"]
        yield _Entry(name, dtype, tuple(info["shape"]), 8 + header_len + begin, end - begin)


def _read(f, entry: _Entry, into: torch.Tensor) -> None:
    """Fill `into` (contiguous, on the CPU, of the entry's dtype and size) with the entry's bytes."""
    expected = into.numel() * into.element_size()
    if entry.num_bytes != expected:
        raise ValueError(f"tensor {entry.name} holds {entry.num_bytes} bytes, its shape needs {expected}")
    f.seek(entry.start)
    if f.readinto(into.reshape(-1).view(torch.uint8).numpy()) != expected:
        raise ValueError(f"tensor {entry.name} is truncated")


def load_safetensors(model: nn.Module, model_dir: Path,
                     transform: Callable[[str, torch.Tensor], torch.Tensor] | None = None) -> None:
    """Copy every checkpoint tensor into `model`'s parameters (model.checkpoint_name maps names; None
    skips a tensor). `transform(name, tensor)` may adjust a tensor before the copy.

    ValueError for a tensor the model has no place for, a shape mismatch, or parameters left unfilled."""
    params = dict(model.named_parameters())
    loaded: set[str] = set()  # parameter names, and "name#index" for each part of a fused one
    for file in safetensors_files(model_dir):
        with file.open("rb") as f:
            for entry in _entries(file):
                name = model.checkpoint_name(entry.name)
                if name is not None:
                    _load_entry(model, name, entry, f, params, loaded, transform)
    fused_parts = {name: len(layer_sizes) for name, layer_sizes in _fused_names(model)}
    missing = {name for name in params if name not in loaded
               or any(f"{name}#{i}" not in loaded for i in range(fused_parts.get(name, 0)))}
    if missing:
        raise ValueError(f"weights missing from {model_dir}: {sorted(missing)[:5]}")


def _load_entry(model: nn.Module, name: str, entry: _Entry, f, params: dict[str, nn.Parameter], loaded: set[str],
                transform: Callable[[str, torch.Tensor], torch.Tensor] | None) -> None:
    target, rows, part_index = _destination(model, name)
    param = params.get(target)
    if param is None:
        raise ValueError(f"unexpected weight {entry.name} (this model has no {target})")
    destination = param.data if rows is None else param.data[rows]
    if tuple(destination.shape) != entry.shape:
        raise ValueError(f"weight {entry.name} has shape {entry.shape}, the model expects {tuple(destination.shape)}")
    if (transform is None and destination.dtype == entry.dtype and destination.device.type == "cpu"
            and destination.is_contiguous()):
        _read(f, entry, destination)  # straight into the parameter: no copy at all
    else:
        tensor = torch.empty(entry.shape, dtype=entry.dtype)
        _read(f, entry, tensor)
        destination.copy_(tensor if transform is None else transform(name, tensor))
    loaded.add(target)
    # a fused parameter is whole once each of its parts arrived, or it arrived fused (Phi-3)
    loaded.update(f"{target}#{i}" for i in (range(3) if part_index is None else (part_index,)))


def _destination(model: nn.Module, name: str) -> tuple[str, slice | None, int | None]:
    """(parameter name, its rows that hold this checkpoint tensor or None for all, part index)."""
    for part, (fused, index) in _FUSED_PARTS.items():
        if f".{part}." in name:
            layer = model.layers[int(name.split(".")[1])]
            sizes = layer.qkv_sizes if fused == "qkv_proj" else (layer.intermediate_size,) * 2
            offset = sum(sizes[:index])
            return name.replace(part, fused), slice(offset, offset + sizes[index]), index
    return name, None, None


def _fused_names(model: nn.Module):
    """(parameter name, its parts) of every fused parameter a checkpoint may fill part by part."""
    for i, layer in enumerate(model.layers):
        for fused, sizes in (("qkv_proj", layer.qkv_sizes), ("gate_up_proj", (layer.intermediate_size,) * 2)):
            for kind in ("weight", "bias"):
                if getattr(getattr(layer, fused), kind, None) is not None:
                    yield f"layers.{i}.{fused}.{kind}", sizes
