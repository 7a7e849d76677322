"""Paged attention for CPUs.

Decoding requests (one query each) and short runs of queries (jump-forward catch-ups) are
attended together in one call per layer: Formwork's own kernel (engine/kernels/csrc/paged_attention.cpp)
reads their K/V straight from the cache blocks; without it, decodes are gathered into a padded
copy for SDPA. Longer runs (prompt chunks) are attended one request at a time with torch's SDPA
(there are few per step, and a fresh prompt needs no gather at all).

Attention math is fp32 whatever the model's dtype: torch's CPU SDPA kernel is about 4x slower in
bf16 than in fp32 here (7.7 vs 1.9 ms a layer at 64 decodes). The cache holds the model's dtype
when the kernel is there (it reads bf16 and computes in fp32: half the bytes to read), else fp32.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from engine.attention.base import AttentionBackend, AttentionInputs, write_kv
from engine.kernels.loader import load_cpu_kernels


# Queries per request that the kernel attends one by one (each re-reads its request's K/V); longer
# runs (prompt chunks) go to SDPA, which shares the reads across queries.
MAX_KERNEL_QUERY_LEN = 16


@dataclass
class _Chunk:
    """A request with more than one query this step."""

    start: int  # first query token in the flat batch
    end: int
    num_computed: int  # cached tokens before this step
    block_ids: torch.Tensor | None  # blocks to gather, None when nothing was cached before


@dataclass
class CpuAttentionMetadata:
    slot_mapping: torch.Tensor
    block_size: int
    # single queries: decodes, and with the kernel every query of a short run (see build_metadata)
    decode_token_ids: torch.Tensor  # [num_queries] flat index of each query
    decode_block_table: torch.Tensor  # [num_queries, num_blocks] int32: its request's blocks
    decode_seq_lens: torch.Tensor  # [num_queries] int32: keys it attends to (causal: up to itself)
    decode_mask: torch.Tensor | None  # torch path only: [num_decodes, 1, 1, num_blocks * block_size] True = attend
    chunks: list[_Chunk]


class CpuAttentionBackend(AttentionBackend):
    def __init__(self) -> None:
        self.kernels = load_cpu_kernels()

    def kv_cache_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        return model_dtype if self.kernels is not None else torch.float32

    def build_metadata(self, inputs: AttentionInputs) -> CpuAttentionMetadata:
        qsl, seq_lens = inputs.query_start_loc, inputs.seq_lens
        query_lens = np.diff(qsl)
        bs = inputs.block_size
        # the kernel takes every query of a short run (decodes, jump-forward catch-ups, small chunks)
        # as a decode of its own: same blocks, its own causal length
        max_kernel_query_len = MAX_KERNEL_QUERY_LEN if self.kernels is not None else 1
        kernel_rows = np.flatnonzero(query_lens <= max_kernel_query_len)
        lens = query_lens[kernel_rows]
        offsets = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
        decode_token_ids = torch.from_numpy((np.repeat(qsl[kernel_rows], lens) + offsets).astype(np.int64))
        first_new = inputs.num_computed_tokens[kernel_rows]
        decode_seq_lens = torch.from_numpy((np.repeat(first_new, lens) + offsets + 1).astype(np.int32))
        num_blocks = int(-(-seq_lens[kernel_rows].max() // bs)) if len(kernel_rows) else 0
        decode_block_table = inputs.block_table[torch.from_numpy(np.repeat(kernel_rows, lens)), :num_blocks].contiguous()
        decode_mask = None
        if self.kernels is None:
            key_pos = torch.arange(num_blocks * bs)
            decode_mask = (key_pos[None, :] < decode_seq_lens[:, None])[:, None, None, :]
        chunks = []
        for row in np.flatnonzero(query_lens > max_kernel_query_len):
            num_computed = int(inputs.num_computed_tokens[row])
            block_ids = None
            if num_computed:
                num_blocks = int(-(-seq_lens[row] // bs))
                block_ids = inputs.block_table[row, :num_blocks].long()
            chunks.append(_Chunk(int(qsl[row]), int(qsl[row + 1]), num_computed, block_ids))
        return CpuAttentionMetadata(inputs.slot_mapping, bs, decode_token_ids, decode_block_table, decode_seq_lens,
                                    decode_mask, chunks)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                metadata: CpuAttentionMetadata) -> torch.Tensor:
        m = metadata
        scale = q.shape[-1] ** -0.5
        if self.kernels is not None:
            # one call writes the step's K/V and attends every single query, in the model's dtype
            out = torch.empty(q.shape, dtype=q.dtype)
            self.kernels.paged_attention(out, q, k, v, kv_cache, m.slot_mapping, m.decode_token_ids,
                                         m.decode_block_table, m.decode_seq_lens, scale)
            for c in m.chunks:
                out[c.start:c.end] = _chunk_attention(q, k, v, kv_cache, c).to(q.dtype)
            return out
        write_kv(kv_cache, k.to(kv_cache.dtype), v.to(kv_cache.dtype), m.slot_mapping)
        out = torch.empty(q.shape, dtype=torch.float32)
        if len(m.decode_token_ids):
            o = _gathered_decode(q.index_select(0, m.decode_token_ids).float(), kv_cache, m.decode_block_table,
                                 m.decode_mask)
            out.index_copy_(0, m.decode_token_ids, o)
        for c in m.chunks:
            out[c.start:c.end] = _chunk_attention(q, k, v, kv_cache, c)
        return out.to(q.dtype)


def _chunk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                     c: _Chunk) -> torch.Tensor:
    """One request's run of queries with torch's SDPA, in fp32: [n, H, D]."""
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    q_c = q[c.start:c.end].float().transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
    if c.block_ids is None:  # fresh prompt: its own K/V are the whole context
        k_c = k[c.start:c.end].float().transpose(0, 1).unsqueeze(0)
        v_c = v[c.start:c.end].float().transpose(0, 1).unsqueeze(0)
        o = F.scaled_dot_product_attention(q_c, k_c, v_c, is_causal=True, enable_gqa=True)
    else:  # prefix-cache hit or a later chunk: attend over the cached context too
        seq_len = c.num_computed + c.end - c.start
        k_c = kv_cache[0].index_select(0, c.block_ids).view(-1, num_kv_heads, head_dim)[:seq_len]
        v_c = kv_cache[1].index_select(0, c.block_ids).view(-1, num_kv_heads, head_dim)[:seq_len]
        k_c = k_c.float().transpose(0, 1).unsqueeze(0)
        v_c = v_c.float().transpose(0, 1).unsqueeze(0)
        query_pos = torch.arange(c.num_computed, seq_len)
        mask = torch.arange(seq_len)[None, :] <= query_pos[:, None]
        o = F.scaled_dot_product_attention(q_c, k_c, v_c, attn_mask=mask, enable_gqa=True)
    return o.squeeze(0).transpose(0, 1)


def _gathered_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                     mask: torch.Tensor) -> torch.Tensor:
    """Without the kernel: copy each request's blocks into a padded batch, then masked SDPA."""
    num_decodes = q.shape[0]
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    block_ids = block_table.flatten().long()
    k = kv_cache[0].index_select(0, block_ids).view(num_decodes, -1, num_kv_heads, head_dim).transpose(1, 2)
    v = kv_cache[1].index_select(0, block_ids).view(num_decodes, -1, num_kv_heads, head_dim).transpose(1, 2)
    o = F.scaled_dot_product_attention(q.unsqueeze(2), k.float(), v.float(), attn_mask=mask, enable_gqa=True)
    return o.squeeze(2)
