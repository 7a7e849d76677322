"""Paged attention for CPUs.

With Formwork's own kernel (engine/kernels/csrc/paged_attention.cpp) every query of the step, decode
or prompt row, is attended in one call per layer, reading K/V straight from the cache blocks. One
kernel for every query is what keeps greedy answers independent of the batch: a query's output is
the same bits whether it is decoded, prefilled with its whole prompt, chunked, or the one new row
of a prompt answered from the prefix cache (torch's SDPA sums in an order that depends on the
lengths it is given). Without the kernel, decodes are gathered into a padded copy for SDPA, and runs
of queries (prompt chunks) are attended one request at a time with SDPA.

A layer with a sliding window or soft-capped scores (AttentionOptions) goes to the kernel when the
loaded kernel takes both (checked once, by a probe: see `kernel_takes_window_and_softcap`), else its
queries take the torch paths, with the window in the mask.

Attention math is fp32 whatever the model's dtype: torch's CPU SDPA kernel is about 4x slower in
bf16 than in fp32 here (7.7 vs 1.9 ms a layer at 64 decodes). The cache holds the model's dtype
when the kernel is there (it reads bf16 and computes in fp32: half the bytes to read), else fp32.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from engine.attention.base import DEFAULT_OPTIONS, AttentionBackend, AttentionInputs, AttentionOptions, write_kv
from engine.kernels.loader import load_cpu_kernels


@dataclass
class _Chunk:
    """A request with more than one query this step, attended with SDPA (no kernel)."""

    start: int  # first query token in the flat batch
    end: int
    num_computed: int  # cached tokens before this step
    block_ids: torch.Tensor | None  # blocks to gather, None when nothing was cached before


@dataclass
class CpuAttentionMetadata:
    slot_mapping: torch.Tensor
    block_size: int
    # single queries: decodes, and with the kernel every query of the step (see build_metadata)
    decode_token_ids: torch.Tensor  # [num_queries] flat index of each query
    decode_block_table: torch.Tensor  # [num_queries, num_blocks] int32: its request's blocks
    decode_seq_lens: torch.Tensor  # [num_queries] int32: keys it attends to (causal: up to itself)
    decode_mask: torch.Tensor | None  # torch path only: [num_decodes, 1, 1, num_blocks * block_size] True = attend
    chunks: list[_Chunk]


class CpuAttentionBackend(AttentionBackend):
    def __init__(self) -> None:
        self.kernels = load_cpu_kernels()
        # whether windowed / soft-capped layers can use the kernel too
        self.kernel_options = self.kernels is not None and kernel_takes_window_and_softcap(self.kernels)

    def kv_cache_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        return model_dtype if self.kernels is not None else torch.float32

    def build_metadata(self, inputs: AttentionInputs) -> CpuAttentionMetadata:
        qsl, seq_lens = inputs.query_start_loc, inputs.seq_lens
        query_lens = np.diff(qsl)
        bs = inputs.block_size
        # the kernel takes every query (decodes, jump-forward catch-ups, prompt chunks) as a decode
        # of its own: same blocks, its own causal length; without it, only decodes go this way
        max_kernel_query_len = int(query_lens.max(initial=0)) if self.kernels is not None else 1
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

    def kernel_arguments(self, metadata: CpuAttentionMetadata, options: AttentionOptions,
                         head_dim: int) -> tuple | None:
        m = metadata
        if self.kernels is None or options.sliding_window or options.softcap or m.chunks:
            return None
        return m.slot_mapping, m.decode_token_ids, m.decode_block_table, m.decode_seq_lens, options.scale_for(head_dim)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                metadata: CpuAttentionMetadata, options: AttentionOptions = DEFAULT_OPTIONS) -> torch.Tensor:
        m = metadata
        scale = options.scale_for(q.shape[-1])
        plain = not options.sliding_window and not options.softcap
        if self.kernels is not None and (plain or self.kernel_options):
            # one call writes the step's K/V and attends every single query, in the model's dtype
            out = torch.empty(q.shape, dtype=q.dtype)
            extra = () if plain else (options.sliding_window, options.softcap)
            self.kernels.paged_attention(out, q, k, v, kv_cache, m.slot_mapping, m.decode_token_ids,
                                         m.decode_block_table, m.decode_seq_lens, scale, *extra)
            for c in m.chunks:
                out[c.start:c.end] = _chunk_attention(q, k, v, kv_cache, c, options).to(q.dtype)
            return out
        write_kv(kv_cache, k.to(kv_cache.dtype), v.to(kv_cache.dtype), m.slot_mapping)
        out = torch.empty(q.shape, dtype=torch.float32)
        if len(m.decode_token_ids):
            mask = m.decode_mask
            if mask is None or options.sliding_window:
                mask = _decode_mask(m.decode_seq_lens, m.decode_block_table.shape[1] * m.block_size,
                                    options.sliding_window)
            o = _gathered_decode(q.index_select(0, m.decode_token_ids).float(), kv_cache, m.decode_block_table,
                                 mask, options)
            out.index_copy_(0, m.decode_token_ids, o)
        for c in m.chunks:
            out[c.start:c.end] = _chunk_attention(q, k, v, kv_cache, c, options)
        return out.to(q.dtype)


def kernel_takes_window_and_softcap(kernels) -> bool:
    """Whether `kernels.paged_attention` takes (sliding_window, softcap) after scale and honours them:
    two keys whose values are 0 and 1, probed with a window of one key, then with a tight cap."""
    head_dim = 64
    q = torch.ones(2, 1, head_dim)
    k = torch.zeros(2, 1, head_dim)
    k[0] = 10.0  # key 0 wins by far, unless the scores are capped
    v = torch.stack((torch.zeros(1, head_dim), torch.ones(1, head_dim)))
    try:
        outputs = []
        for window, softcap in ((1, 0.0), (0, 1e-3)):
            out = torch.empty(2, 1, head_dim)
            kernels.paged_attention(out, q, k, v, torch.zeros(2, 2, 16, 1, head_dim), torch.tensor([16, 17]),
                                    torch.tensor([0, 1]), torch.ones(2, 1, dtype=torch.int32),
                                    torch.tensor([1, 2], dtype=torch.int32), head_dim ** -0.5, window, softcap)
            outputs.append(float(out[1].mean()))
    except (TypeError, RuntimeError):
        return False
    windowed, capped = outputs
    return abs(windowed - 1.0) < 1e-3 and abs(capped - 0.5) < 1e-2


def _decode_mask(seq_lens: torch.Tensor, num_keys: int, sliding_window: int) -> torch.Tensor:
    """[n, 1, 1, num_keys] True = attend: each single query sees its request's keys up to itself,
    only the last `sliding_window` of them when set."""
    key_pos = torch.arange(num_keys)[None, :]
    mask = key_pos < seq_lens[:, None]
    if sliding_window:
        mask &= key_pos >= seq_lens[:, None] - sliding_window
    return mask[:, None, None, :]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
            options: AttentionOptions) -> torch.Tensor:
    """Attention of q [.., H, n, D] over k, v [.., KVH, m, D] (fp32); mask None: causal over a fresh prompt."""
    scale = options.scale_for(q.shape[-1])
    if not options.softcap:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale,
                                              enable_gqa=True)
    group = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / options.softcap) * options.softcap
    if mask is None:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    return torch.matmul(scores.masked_fill(~mask, float("-inf")).softmax(dim=-1), v)


def _chunk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                     c: _Chunk, options: AttentionOptions) -> torch.Tensor:
    """One request's run of queries with torch's SDPA, in fp32: [n, H, D]."""
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    q_c = q[c.start:c.end].float().transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
    if c.block_ids is None:  # fresh prompt: its own K/V are the whole context
        k_c = k[c.start:c.end].float().transpose(0, 1).unsqueeze(0)
        v_c = v[c.start:c.end].float().transpose(0, 1).unsqueeze(0)
    else:  # prefix-cache hit or a later chunk: attend over the cached context too
        seq_len = c.num_computed + c.end - c.start
        k_c = kv_cache[0].index_select(0, c.block_ids).view(-1, num_kv_heads, head_dim)[:seq_len]
        v_c = kv_cache[1].index_select(0, c.block_ids).view(-1, num_kv_heads, head_dim)[:seq_len]
        k_c = k_c.float().transpose(0, 1).unsqueeze(0)
        v_c = v_c.float().transpose(0, 1).unsqueeze(0)
    mask = None
    if c.block_ids is not None or options.sliding_window:
        seq_len = c.num_computed + c.end - c.start
        query_pos = torch.arange(c.num_computed, seq_len)[:, None]
        key_pos = torch.arange(seq_len)[None, :]
        mask = key_pos <= query_pos
        if options.sliding_window:
            mask &= key_pos > query_pos - options.sliding_window
    o = _attend(q_c, k_c, v_c, mask, options)
    return o.squeeze(0).transpose(0, 1)


def _gathered_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                     mask: torch.Tensor, options: AttentionOptions) -> torch.Tensor:
    """Without the kernel: copy each request's blocks into a padded batch, then masked SDPA."""
    num_decodes = q.shape[0]
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    block_ids = block_table.flatten().long()
    k = kv_cache[0].index_select(0, block_ids).view(num_decodes, -1, num_kv_heads, head_dim).transpose(1, 2)
    v = kv_cache[1].index_select(0, block_ids).view(num_decodes, -1, num_kv_heads, head_dim).transpose(1, 2)
    return _attend(q.unsqueeze(2), k.float(), v.float(), mask, options).squeeze(2)
