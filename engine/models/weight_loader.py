"""Reading a Hugging Face folder's safetensors into a model's parameters.

Memory: the model is built on the meta device and given empty storage in the served dtype
(engine/worker/model_runner.py), so the parameters exist once; each checkpoint tensor is read from
the memory-mapped file and copied (cast) into its parameter, then dropped. Peak memory is the
weights plus the largest single tensor, with no fp32 copy of the model at any point.

Checkpoints store q/k/v and gate/up separately (most families) or already fused (Phi-3); the
model holds them fused (`qkv_proj`, `gate_up_proj`), so separate parts are copied into their rows.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

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


def load_safetensors(model: nn.Module, model_dir: Path,
                     transform: Callable[[str, torch.Tensor], torch.Tensor] | None = None) -> None:
    """Copy every checkpoint tensor into `model`'s parameters (model.checkpoint_name maps names; None
    skips a tensor). `transform(name, tensor)` may adjust a tensor before the copy.

    ValueError for a tensor the model has no place for, a shape mismatch, or parameters left unfilled."""
    from safetensors import safe_open

    params = dict(model.named_parameters())
    loaded: set[str] = set()  # parameter names, and "name#index" for each part of a fused one
    for file in safetensors_files(model_dir):
        with safe_open(str(file), framework="pt") as f:
            for checkpoint_name in f.keys():
                name = model.checkpoint_name(checkpoint_name)
                if name is None:
                    continue
                tensor = f.get_tensor(checkpoint_name)
                if transform is not None:
                    tensor = transform(name, tensor)
                _copy_into(model, name, tensor, params, loaded, checkpoint_name)
                del tensor
    fused_parts = {name: len(layer_sizes) for name, layer_sizes in _fused_names(model)}
    missing = {name for name in params if name not in loaded
               or any(f"{name}#{i}" not in loaded for i in range(fused_parts.get(name, 0)))}
    if missing:
        raise ValueError(f"weights missing from {model_dir}: {sorted(missing)[:5]}")


def _copy_into(model: nn.Module, name: str, tensor: torch.Tensor, params: dict[str, nn.Parameter],
               loaded: set[str], checkpoint_name: str) -> None:
    target, rows, part_index = name, None, None
    for part, (fused, index) in _FUSED_PARTS.items():
        if f".{part}." in name:
            layer = model.layers[int(name.split(".")[1])]
            sizes = layer.qkv_sizes if fused == "qkv_proj" else (layer.intermediate_size,) * 2
            offset = sum(sizes[:index])
            target, rows, part_index = name.replace(part, fused), slice(offset, offset + sizes[index]), index
            break
    param = params.get(target)
    if param is None:
        raise ValueError(f"unexpected weight {checkpoint_name} (this model has no {target})")
    destination = param.data if rows is None else param.data[rows]
    if destination.shape != tensor.shape:
        raise ValueError(f"weight {checkpoint_name} has shape {tuple(tensor.shape)}, "
                         f"the model expects {tuple(destination.shape)}")
    destination.copy_(tensor)
    loaded.add(target)
    # a fused parameter is whole once each of its parts arrived, or it arrived fused (Phi-3)
    loaded.update(f"{target}#{i}" for i in (range(3) if part_index is None else (part_index,)))


def _fused_names(model: nn.Module):
    """(parameter name, its parts) of every fused parameter a checkpoint may fill part by part."""
    for i, layer in enumerate(model.layers):
        for fused, sizes in (("qkv_proj", layer.qkv_sizes), ("gate_up_proj", (layer.intermediate_size,) * 2)):
            for kind in ("weight", "bias"):
                if getattr(getattr(layer, fused), kind, None) is not None:
                    yield f"layers.{i}.{fused}.{kind}", sizes
