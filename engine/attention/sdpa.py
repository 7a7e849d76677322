"""Paged attention through torch's scaled_dot_product_attention: the CUDA fallback when flash-attn
is missing or unusable (engine/attention/flash.py decides), written in device-agnostic torch so
that its tests run on the CPU.

Per step and per layer, at most two SDPA calls:

* decode rows (one query each) are attended together over their gathered blocks, keys padded to
  the longest row's block count and masked by `seq_lens`;
* all rows with several queries (prompts, prompt chunks, prefix-cache hits, jump-forward text) are
  packed into one call: their context keys are gathered slot by slot and a mask keeps each query
  to its own request, causally. Packing wastes work quadratic in the step's token count, which
  is small next to launching one call per request (the step budget bounds it).

A sliding window narrows both masks; a soft cap on the scores (Gemma 2) is not something SDPA
computes, so soft-capped layers take the same gathers through an explicit softmax instead.

Grouped-query attention never goes through SDPA's `enable_gqa` (not every CUDA kernel takes it):
the queries of one KV head are folded into the query-length dimension instead, so each K/V head
is read once for all of its query heads.

Decode metadata built from device tensors (`decode_metadata`) makes `forward` free of host
synchronisation, so a decode step can be captured in a CUDA graph (engine/worker/cuda_graph.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from engine.attention.base import DEFAULT_OPTIONS, AttentionBackend, AttentionInputs, AttentionOptions, write_kv

_KEY_ALIGN = 16  # packed key count rounded up to this (memory-efficient kernels want aligned masks)


@dataclass
class DecodeRows:
    """Requests with one query this step."""

    token_ids: torch.Tensor | None  # [n] flat index of each row's query; None: every token, in order
    block_table: torch.Tensor  # [n, num_blocks] int32: blocks to gather, padded with block 0
    seq_lens: torch.Tensor  # [n] int32: keys of each row (the cached ones plus this query)


@dataclass
class PackedRows:
    """Requests with several queries this step, attended in one packed call."""

    token_ids: torch.Tensor | None  # [num_queries] flat index of each query; None: every token, in order
    key_slots: torch.Tensor  # [num_keys] int64: cache slot of each context key, request by request
    mask: torch.Tensor  # [num_queries, num_keys] bool: True = attend
    query_pos: torch.Tensor  # [num_queries] int64: position of each query in its request
    key_pos: torch.Tensor  # [num_keys] int64: position of each key in its request


@dataclass
class SdpaAttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64
    decode: DecodeRows | None
    packed: PackedRows | None


class SdpaAttentionBackend(AttentionBackend):
    """Stateless; any device torch runs SDPA on."""

    supports_decode_metadata = True

    def build_metadata(self, inputs: AttentionInputs) -> SdpaAttentionMetadata:
        qsl, seq_lens, bs = inputs.query_start_loc, inputs.seq_lens, inputs.block_size
        device = inputs.slot_mapping.device
        query_lens = np.diff(qsl)
        num_reqs = len(query_lens)
        decode = packed = None
        decode_rows = np.flatnonzero(query_lens == 1)
        if len(decode_rows):
            num_blocks = int(-(-int(seq_lens[decode_rows].max()) // bs))
            all_decode = len(decode_rows) == num_reqs
            block_table = inputs.block_table[:, :num_blocks] if all_decode else \
                inputs.block_table[torch.from_numpy(decode_rows).to(device), :num_blocks]
            decode = DecodeRows(
                token_ids=None if all_decode else _to(qsl[decode_rows].astype(np.int64), device),
                block_table=block_table,
                seq_lens=_to(seq_lens[decode_rows].astype(np.int32), device))
        packed_rows = np.flatnonzero(query_lens > 1)
        if len(packed_rows):
            packed = self._packed(inputs, packed_rows, len(packed_rows) == num_reqs, device)
        return SdpaAttentionMetadata(inputs.slot_mapping, decode, packed)

    @staticmethod
    def _packed(inputs: AttentionInputs, rows: np.ndarray, all_packed: bool, device: torch.device) -> PackedRows:
        qsl, seq_lens, bs = inputs.query_start_loc, inputs.seq_lens, inputs.block_size
        query_lens = (qsl[rows + 1] - qsl[rows]).astype(np.int64)
        key_lens = seq_lens[rows].astype(np.int64)
        # queries: request index and position; request i's queries are its last query_lens[i] keys,
        # so flat query j of request i sits at key_lens[i] - query_lens[i] + (j - first query of i)
        query_req = np.repeat(np.arange(len(rows)), query_lens)
        query_pos = np.repeat(key_lens - np.cumsum(query_lens), query_lens) + np.arange(int(query_lens.sum()))
        # keys: every position of each request's context, padded to the alignment with request -1
        num_keys = int(key_lens.sum())
        padded = -(-num_keys // _KEY_ALIGN) * _KEY_ALIGN
        key_req = np.full(padded, -1, dtype=np.int64)
        key_req[:num_keys] = np.repeat(np.arange(len(rows)), key_lens)
        key_pos = np.zeros(padded, dtype=np.int64)
        key_pos[:num_keys] = np.arange(num_keys) - np.repeat(np.cumsum(key_lens) - key_lens, key_lens)
        key_row = np.zeros(padded, dtype=np.int64)  # batch row whose block table holds the key
        key_row[:num_keys] = rows[key_req[:num_keys]]
        key_req_t, key_pos_t = _to(key_req, device), _to(key_pos, device)
        blocks = inputs.block_table[_to(key_row, device), key_pos_t // bs].long()
        key_slots = torch.where(key_req_t >= 0, blocks * bs + key_pos_t % bs, 0)  # padding reads slot 0
        query_pos_t = _to(query_pos, device)
        mask = (_to(query_req, device)[:, None] == key_req_t[None, :]) & (key_pos_t[None, :] <= query_pos_t[:, None])
        token_ids = None
        if not all_packed:
            token_ids = _to(np.concatenate([np.arange(qsl[r], qsl[r + 1]) for r in rows]).astype(np.int64), device)
        return PackedRows(token_ids, key_slots, mask, query_pos_t, key_pos_t)

    def decode_metadata(self, slot_mapping: torch.Tensor, block_table: torch.Tensor,
                        seq_lens: torch.Tensor) -> SdpaAttentionMetadata:
        """Metadata for a step where every token is one request's only query, from device tensors
        the caller owns: `forward` then runs without host synchronisation (CUDA-graph safe).

        slot_mapping [n] int64, block_table [n, num_blocks] int32, seq_lens [n] int32.
        """
        return SdpaAttentionMetadata(slot_mapping, DecodeRows(None, block_table, seq_lens), None)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                metadata: SdpaAttentionMetadata, options: AttentionOptions = DEFAULT_OPTIONS) -> torch.Tensor:
        m = metadata
        write_kv(kv_cache, k, v, m.slot_mapping)
        num_kv_heads = k.shape[1]
        if m.packed is None and m.decode is not None and m.decode.token_ids is None:
            return _decode(q, kv_cache, m.decode, num_kv_heads, options)  # a pure decode step (the graph case)
        if m.decode is None and m.packed is not None and m.packed.token_ids is None:
            return _packed(q, kv_cache, m.packed, num_kv_heads, options)
        out = torch.empty_like(q)
        for rows, attend in ((m.decode, _decode), (m.packed, _packed)):
            if rows is not None:
                out.index_copy_(0, rows.token_ids, attend(q.index_select(0, rows.token_ids), kv_cache, rows,
                                                          num_kv_heads, options))
        return out


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
               options: AttentionOptions) -> torch.Tensor:
    """softmax(q k^T * scale, capped, masked) v over [..., queries, dim] / [..., keys, dim]; mask True = attend."""
    scale = options.scale_for(q.shape[-1])
    if not options.softcap:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    scores = torch.tanh(scores / options.softcap) * options.softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(scores.softmax(dim=-1).to(v.dtype), v)


def _decode(q: torch.Tensor, kv_cache: torch.Tensor, rows: DecodeRows, num_kv_heads: int,
            options: AttentionOptions) -> torch.Tensor:
    """q [n, num_heads, head_dim] -> [n, num_heads, head_dim]."""
    n, num_heads, head_dim = q.shape
    num_blocks = rows.block_table.shape[1]
    num_keys = num_blocks * kv_cache.shape[2]
    block_ids = rows.block_table.reshape(-1)
    k = kv_cache[0].index_select(0, block_ids).view(n, num_keys, num_kv_heads, head_dim).transpose(1, 2)
    v = kv_cache[1].index_select(0, block_ids).view(n, num_keys, num_kv_heads, head_dim).transpose(1, 2)
    key_pos = torch.arange(num_keys, device=q.device)[None, :]
    mask = key_pos < rows.seq_lens[:, None]
    if options.sliding_window:  # the query is the last key: the window is the last W keys
        mask &= key_pos >= rows.seq_lens[:, None] - options.sliding_window
    # the query heads of one KV head become that head's "query length": [n, kv_heads, group, dim]
    q = q.view(n, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = _attention(q, k, v, mask[:, None, None, :], options)
    return out.reshape(n, num_heads, head_dim)


def _packed(q: torch.Tensor, kv_cache: torch.Tensor, rows: PackedRows, num_kv_heads: int,
            options: AttentionOptions) -> torch.Tensor:
    """q [m, num_heads, head_dim] (queries of several requests) -> [m, num_heads, head_dim]."""
    m, num_heads, head_dim = q.shape
    group = num_heads // num_kv_heads
    k = kv_cache[0].view(-1, num_kv_heads, head_dim).index_select(0, rows.key_slots).transpose(0, 1)
    v = kv_cache[1].view(-1, num_kv_heads, head_dim).index_select(0, rows.key_slots).transpose(0, 1)
    # [kv_heads, group * m, dim]: rows ordered (group, query), so the mask repeats `group` times
    q = q.view(m, num_kv_heads, group, head_dim).permute(1, 2, 0, 3).reshape(num_kv_heads, group * m, head_dim)
    mask = rows.mask
    if options.sliding_window:
        mask = mask & (rows.key_pos[None, :] > rows.query_pos[:, None] - options.sliding_window)
    mask = mask.repeat(group, 1)
    out = _attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), mask[None, None], options)
    return out[0].view(num_kv_heads, group, m, head_dim).permute(2, 0, 1, 3).reshape(m, num_heads, head_dim)


def _to(array: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(array).to(device)
