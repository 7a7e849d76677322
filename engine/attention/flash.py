"""flash-attn over the paged cache.

The only module that imports flash-attn, lazily (inside `load_flash_attn`). It uses the
flash-attn 2 API over the cache layout of engine/attention/base.py ([2, num_blocks, block_size,
kv_heads, head_dim] per layer: K and V each in flash-attn's paged layout):

* any step: `flash_attn_varlen_func(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, ...,
  causal=True, block_table=...)`: prompts, chunks, prefix-cache hits and decodes in one call
  (causal masks align to the end of each request's keys);
* decode-only steps built by `decode_metadata` (CUDA graphs): `flash_attn_with_kvcache` with
  `cache_seqlens` and the block table.

A layer's scale, sliding window and soft cap (AttentionOptions) become flash-attn's `softmax_scale`,
`window_size=(W - 1, 0)` (W keys: the query and the W - 1 before it) and `softcap`.

flash-attn 2's paged kernels take only KV blocks of a multiple of 256 tokens. With the engine's
default block size (16), or without flash-attn installed, `get_attention_backend` (auto) selects
torch SDPA over the same cache (engine/attention/sdpa.py) and says why in a warning; asking for
"flash_attn" explicitly raises a ValueError that says what to change.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch

from engine.attention.base import DEFAULT_OPTIONS, AttentionBackend, AttentionInputs, AttentionOptions, write_kv

logger = logging.getLogger(__name__)

FLASH_ATTN_PAGE_MULTIPLE = 256  # flash-attn 2: "Paged KV cache block size must be divisible by 256"


def load_flash_attn(block_size: int) -> tuple[ModuleType | None, str | None]:
    """flash-attn if it is installed and takes KV blocks of `block_size` tokens, else (None, why not)."""
    try:
        import flash_attn
    except ImportError as e:
        return None, (f"flash-attn is not installed ({e}); install it with pip install 'formwork[cuda]' "
                      "(flash-attn 2 builds from source against the local CUDA toolkit)")
    if block_size % FLASH_ATTN_PAGE_MULTIPLE:
        return None, (f"flash-attn 2's paged kernels need a KV block size divisible by {FLASH_ATTN_PAGE_MULTIPLE}, "
                      f"the cache uses {block_size} (set CacheConfig.block_size / --block-size)")
    return flash_attn, None


@dataclass
class FlashAttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64
    block_table: torch.Tensor  # [num_reqs, max_blocks] int32
    seq_lens: torch.Tensor  # [num_reqs] int32: keys per request after this step
    decode_only: bool  # every request has exactly one query (flash_attn_with_kvcache)
    cu_seqlens_q: torch.Tensor | None = None  # [num_reqs + 1] int32 (varlen only)
    cu_seqlens_k: torch.Tensor | None = None
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0


class FlashAttentionBackend(AttentionBackend):
    supports_decode_metadata = True

    def __init__(self, flash_attn: ModuleType) -> None:
        self._varlen = flash_attn.flash_attn_varlen_func
        self._with_kvcache = flash_attn.flash_attn_with_kvcache

    def build_metadata(self, inputs: AttentionInputs) -> FlashAttentionMetadata:
        device = inputs.slot_mapping.device
        cu_seqlens_k = np.zeros(len(inputs.seq_lens) + 1, dtype=np.int32)
        np.cumsum(inputs.seq_lens, out=cu_seqlens_k[1:])
        query_lens = np.diff(inputs.query_start_loc)
        return FlashAttentionMetadata(
            slot_mapping=inputs.slot_mapping,
            block_table=inputs.block_table.to(torch.int32).contiguous(),
            seq_lens=torch.from_numpy(inputs.seq_lens.astype(np.int32)).to(device),
            decode_only=False,
            cu_seqlens_q=torch.from_numpy(inputs.query_start_loc.astype(np.int32)).to(device),
            cu_seqlens_k=torch.from_numpy(cu_seqlens_k).to(device),
            max_seqlen_q=int(query_lens.max()),
            max_seqlen_k=int(inputs.seq_lens.max()),
        )

    def decode_metadata(self, slot_mapping: torch.Tensor, block_table: torch.Tensor,
                        seq_lens: torch.Tensor) -> FlashAttentionMetadata:
        """Decode-only metadata from caller-owned device tensors (CUDA-graph safe), as in
        SdpaAttentionBackend.decode_metadata."""
        return FlashAttentionMetadata(slot_mapping, block_table, seq_lens, decode_only=True)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                metadata: FlashAttentionMetadata, options: AttentionOptions = DEFAULT_OPTIONS) -> torch.Tensor:
        m = metadata
        write_kv(kv_cache, k, v, m.slot_mapping)
        layer_args = flash_layer_args(options, q.shape[-1])
        if m.decode_only:
            out = self._with_kvcache(q.unsqueeze(1), kv_cache[0], kv_cache[1], cache_seqlens=m.seq_lens,
                                     block_table=m.block_table, causal=True, **layer_args)
            return out.squeeze(1)
        return self._varlen(q, kv_cache[0], kv_cache[1], m.cu_seqlens_q, m.cu_seqlens_k, m.max_seqlen_q,
                            m.max_seqlen_k, causal=True, block_table=m.block_table, **layer_args)


def flash_layer_args(options: AttentionOptions, head_dim: int) -> dict:
    """flash-attn's keyword arguments for a layer's options (-1: no limit on that side)."""
    left = options.sliding_window - 1 if options.sliding_window else -1
    return {"softmax_scale": options.scale_for(head_dim), "window_size": (left, 0), "softcap": options.softcap}
