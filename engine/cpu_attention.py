"""Paged attention in plain torch, for CPUs.

Decoding requests (one query each) are attended together in one batched call per layer over
their gathered blocks; prompt chunks are attended one request at a time (there are few per
step, and a fresh prompt needs no gather at all).

Attention runs in fp32 over an fp32 cache whatever the model's dtype: torch's CPU SDPA kernel is
about 4x slower in bf16 than in fp32 here (7.7 vs 1.9 ms a layer at 64 decodes), while the casts
of q/k/v cost microseconds.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from engine.attention import AttentionBackend, AttentionInputs, write_kv


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
    decode_token_ids: torch.Tensor  # [num_decodes] flat index of each decoding request's query
    decode_block_ids: torch.Tensor  # [num_decodes, num_blocks] blocks to gather
    decode_mask: torch.Tensor  # [num_decodes, 1, 1, num_blocks * block_size] True = attend
    chunks: list[_Chunk]


class CpuAttentionBackend(AttentionBackend):
    def build_metadata(self, inputs: AttentionInputs) -> CpuAttentionMetadata:
        qsl, seq_lens = inputs.query_start_loc, inputs.seq_lens
        query_lens = np.diff(qsl)
        bs = inputs.block_size
        decode_rows = np.flatnonzero(query_lens == 1)
        if len(decode_rows):
            num_blocks = int(-(-seq_lens[decode_rows].max() // bs))
            rows = torch.from_numpy(decode_rows)
            decode_block_ids = inputs.block_table[rows, :num_blocks].long()
            key_pos = torch.arange(num_blocks * bs)
            decode_mask = (key_pos[None, :] < torch.from_numpy(seq_lens[decode_rows].astype(np.int64))[:, None])
            decode_mask = decode_mask[:, None, None, :]
            decode_token_ids = torch.from_numpy(qsl[decode_rows].astype(np.int64))
        else:
            decode_block_ids = torch.empty(0, 0, dtype=torch.long)
            decode_mask = torch.empty(0, 1, 1, 0, dtype=torch.bool)
            decode_token_ids = torch.empty(0, dtype=torch.long)
        chunks = []
        for row in np.flatnonzero(query_lens > 1):
            num_computed = int(inputs.num_computed_tokens[row])
            block_ids = None
            if num_computed:
                num_blocks = int(-(-seq_lens[row] // bs))
                block_ids = inputs.block_table[row, :num_blocks].long()
            chunks.append(_Chunk(int(qsl[row]), int(qsl[row + 1]), num_computed, block_ids))
        return CpuAttentionMetadata(inputs.slot_mapping, bs, decode_token_ids, decode_block_ids,
                                    decode_mask, chunks)

    def kv_cache_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        return torch.float32

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                metadata: CpuAttentionMetadata) -> torch.Tensor:
        model_dtype = q.dtype
        if model_dtype != kv_cache.dtype:
            q, k, v = q.to(kv_cache.dtype), k.to(kv_cache.dtype), v.to(kv_cache.dtype)
        m = metadata
        write_kv(kv_cache, k, v, m.slot_mapping)
        out = torch.empty_like(q)
        num_kv_heads, head_dim = k.shape[1], k.shape[2]
        if len(m.decode_token_ids):
            num_decodes = len(m.decode_token_ids)
            q_dec = q.index_select(0, m.decode_token_ids).unsqueeze(2)  # [n, H, 1, D]
            k_dec = kv_cache[0].index_select(0, m.decode_block_ids.flatten())
            v_dec = kv_cache[1].index_select(0, m.decode_block_ids.flatten())
            k_dec = k_dec.view(num_decodes, -1, num_kv_heads, head_dim).transpose(1, 2)
            v_dec = v_dec.view(num_decodes, -1, num_kv_heads, head_dim).transpose(1, 2)
            o = F.scaled_dot_product_attention(q_dec, k_dec, v_dec, attn_mask=m.decode_mask, enable_gqa=True)
            out.index_copy_(0, m.decode_token_ids, o.squeeze(2))
        for c in m.chunks:
            q_c = q[c.start:c.end].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
            if c.block_ids is None:  # fresh prompt: its own K/V are the whole context
                k_c = k[c.start:c.end].transpose(0, 1).unsqueeze(0)
                v_c = v[c.start:c.end].transpose(0, 1).unsqueeze(0)
                o = F.scaled_dot_product_attention(q_c, k_c, v_c, is_causal=True, enable_gqa=True)
            else:  # prefix-cache hit or a later chunk: attend over the cached context too
                seq_len = c.num_computed + c.end - c.start
                k_c = kv_cache[0].index_select(0, c.block_ids).view(-1, num_kv_heads, head_dim)[:seq_len]
                v_c = kv_cache[1].index_select(0, c.block_ids).view(-1, num_kv_heads, head_dim)[:seq_len]
                k_c = k_c.transpose(0, 1).unsqueeze(0)
                v_c = v_c.transpose(0, 1).unsqueeze(0)
                query_pos = torch.arange(c.num_computed, seq_len)
                mask = torch.arange(seq_len)[None, :] <= query_pos[:, None]
                o = F.scaled_dot_product_attention(q_c, k_c, v_c, attn_mask=mask, enable_gqa=True)
            out[c.start:c.end] = o.squeeze(0).transpose(0, 1)
        return out.to(model_dtype)
