"""The attention backend interface, over a paged KV cache.

KV cache layout, one tensor per layer: [2 (K, V), num_blocks, block_size, num_kv_heads, head_dim]
— flash-attn's paged layout, so a CUDA backend reads the same cache the CPU backend writes.
Token t of a request lives in slot `block_table[t // block_size] * block_size + t % block_size`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class AttentionOptions:
    """How one layer attends; fixed for the layer's lifetime (a model holds one per layer)."""

    scale: float | None = None  # multiplies q . k; None: head_dim ** -0.5
    sliding_window: int = 0  # 0: every earlier key; else only the last `sliding_window` positions, itself included
    softcap: float = 0.0  # 0: none; else scores = softcap * tanh(scores / softcap), before the mask

    def __post_init__(self) -> None:
        if self.sliding_window < 0:
            raise ValueError(f"sliding_window must be >= 0, got {self.sliding_window}")
        if self.softcap < 0:
            raise ValueError(f"softcap must be >= 0, got {self.softcap}")

    def scale_for(self, head_dim: int) -> float:
        return head_dim ** -0.5 if self.scale is None else self.scale


DEFAULT_OPTIONS = AttentionOptions()


@dataclass
class AttentionInputs:
    """Per-step attention facts, shared by every layer. Built once per step by the runner."""

    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot of each scheduled token
    query_start_loc: np.ndarray  # [num_reqs + 1] int32: request i's tokens are [qsl[i], qsl[i+1])
    num_computed_tokens: np.ndarray  # [num_reqs] int32: KV already cached before this step
    seq_lens: np.ndarray  # [num_reqs] int32: num_computed_tokens + scheduled tokens
    block_table: torch.Tensor  # [num_reqs, max_blocks_per_req] int32, rows padded with block 0
    block_size: int


class AttentionBackend(ABC):
    """Writes this step's K/V into the paged cache and attends over it.

    `build_metadata` runs once per step (plain bookkeeping, no tensors of the model's size);
    `forward` runs once per layer and must not keep state between calls.
    """

    @abstractmethod
    def build_metadata(self, inputs: AttentionInputs) -> object:
        """Whatever this backend needs per step, derived from `inputs`."""

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                metadata: object, options: AttentionOptions = DEFAULT_OPTIONS) -> torch.Tensor:
        """q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim].

        Stores k, v at `slot_mapping`, then returns causal attention of each query over its
        request's cached keys (within `options.sliding_window`, scores soft-capped by
        `options.softcap`): [num_tokens, num_heads, head_dim]. Every key stays in the cache
        whatever the window, so prefix-cache hits are unaffected by it.
        """

    # decode_metadata is implemented: decode steps can be captured in CUDA graphs (engine/worker/cuda_graph.py)
    supports_decode_metadata: bool = False

    def decode_metadata(self, slot_mapping: torch.Tensor, block_table: torch.Tensor,
                        seq_lens: torch.Tensor) -> object:
        """Metadata for a step where every token is one request's only query, built from device
        tensors the caller owns, so `forward` runs without host synchronisation (CUDA-graph safe).

        slot_mapping [n] int64, block_table [n, num_blocks] int32, seq_lens [n] int32. Only
        backends with `supports_decode_metadata` implement it.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot build decode metadata from device tensors")

    def kernel_arguments(self, metadata: object, options: AttentionOptions, head_dim: int) -> tuple | None:
        """Where one call of the CPU kernels' paged attention does all of `forward` for this step and
        layer: its arguments after the cache (slot_mapping, query_ids, block_table, seq_lens, scale),
        for a caller that makes that call itself (the kernels' fused decoder layer); else None."""
        return None

    def kv_cache_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The cache's dtype for a model computing in model_dtype; forward receives q/k/v in model_dtype."""
        return model_dtype

    def allocate_kv_cache(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                          head_dim: int, dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
        return [torch.zeros(2, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device)
                for _ in range(num_layers)]


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    kv_cache[0].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    kv_cache[1].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)
