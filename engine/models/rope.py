"""Rotary position embeddings: the rope types of the supported families, as transformers computes them.

A config's `rope_parameters` (transformers standardizes the older `rope_scaling` / `rope_theta` into it,
one dict, or one per layer type for Gemma 3) names a `rope_type`. Each type only changes the inverse
frequencies (and for longrope a scale on cos/sin); the tables are computed in fp32 once for every
position up to the engine's context length, then gathered per step.

Two types depend on the sequence length in transformers, which a batch of requests sharing a prefix
cache cannot follow per request; Formwork decides per position instead:
* dynamic (NTK): transformers rescales only past `max_position_embeddings`, which is also the engine's
  longest context, so the tables are the default ones;
* longrope (Phi-3's "su"): positions before `original_max_position_embeddings` use the short factors,
  later ones the long factors (transformers switches the whole sequence once it is longer).
Both agree with transformers exactly on sequences within the original context.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "longrope")


@dataclass(frozen=True)
class RopeSpec:
    """One rotary table's parameters, read from a config."""

    rope_type: str
    theta: float
    rotary_dim: int  # leading channels of each head that rotate (partial_rotary_factor * head_dim)
    params: tuple[tuple[str, object], ...]  # the rest of the rope dict (factors, original length...)

    def get(self, key: str, default=None):
        return dict(self.params).get(key, default)


def rope_spec(config, head_dim: int, layer_type: str | None = None) -> RopeSpec:
    """The rope of `config` (of its layers of `layer_type` when the parameters are given per layer type);
    ValueError naming the rope type when it is not supported."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = dict(params[layer_type])
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if rope_type == "su":
        rope_type = "longrope"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"rope type {rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    theta = float(params.pop("rope_theta", None) or getattr(config, "rope_theta", None) or 10000.0)
    partial = float(params.pop("partial_rotary_factor", None) or getattr(config, "partial_rotary_factor", None) or 1.0)
    if rope_type == "longrope" and "original_max_position_embeddings" not in params:
        params["original_max_position_embeddings"] = getattr(config, "original_max_position_embeddings", None) \
            or config.max_position_embeddings
    params["max_position_embeddings"] = config.max_position_embeddings
    return RopeSpec(rope_type, theta, int(head_dim * partial), tuple(sorted(params.items(), key=lambda kv: kv[0])))


def _base_inv_freq(spec: RopeSpec) -> torch.Tensor:
    dim = spec.rotary_dim
    return 1.0 / (spec.theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3_inv_freq(spec: RopeSpec) -> torch.Tensor:
    inv_freq = _base_inv_freq(spec)
    factor, low, high = float(spec.get("factor")), float(spec.get("low_freq_factor")), float(spec.get("high_freq_factor"))
    old_len = float(spec.get("original_max_position_embeddings"))
    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _longrope_inv_freq(spec: RopeSpec, factors: list[float]) -> torch.Tensor:
    dim = spec.rotary_dim
    shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (torch.tensor(factors, dtype=torch.float32) * spec.theta ** shape)


def _longrope_scaling(spec: RopeSpec) -> float:
    original = spec.get("original_max_position_embeddings")
    factor = spec.get("factor") or spec.get("max_position_embeddings") / original
    if spec.get("attention_factor") is not None:
        return float(spec.get("attention_factor"))
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def _angles(inv_freq: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    freqs = positions.float()[:, None] * inv_freq[None, :]
    return torch.cat((freqs, freqs), dim=-1)


def rope_tables(spec: RopeSpec, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [max_positions, rotary_dim] fp32, as transformers' rotary embedding computes them."""
    positions = torch.arange(max_positions)
    scaling = 1.0
    if spec.rope_type in ("default", "dynamic"):
        emb = _angles(_base_inv_freq(spec), positions)
    elif spec.rope_type == "linear":
        emb = _angles(_base_inv_freq(spec) / float(spec.get("factor")), positions)
    elif spec.rope_type == "llama3":
        emb = _angles(_llama3_inv_freq(spec), positions)
    else:  # longrope
        original = int(spec.get("original_max_position_embeddings"))
        emb = _angles(_longrope_inv_freq(spec, spec.get("short_factor")), positions)
        if max_positions > original:
            emb[original:] = _angles(_longrope_inv_freq(spec, spec.get("long_factor")), positions[original:])
        scaling = _longrope_scaling(spec)
    return emb.cos() * scaling, emb.sin() * scaling


class RotaryTables:
    """cos/sin tables for every position, built on first use on the positions' device."""

    def __init__(self, spec: RopeSpec, max_positions: int) -> None:
        self.spec = spec
        self.max_positions = max_positions
        self._cos: torch.Tensor | None = None
        self._sin: torch.Tensor | None = None

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-step tables, gathered once and shared by every layer of this rope: [tokens, rotary_dim] each."""
        if self._cos is None or self._cos.device != positions.device:
            cos, sin = rope_tables(self.spec, self.max_positions)
            self._cos, self._sin = cos.to(positions.device), sin.to(positions.device)
        return self._cos[positions].to(dtype), self._sin[positions].to(dtype)
