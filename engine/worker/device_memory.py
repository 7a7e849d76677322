"""Sizing the KV cache from a CUDA device's memory (CudaConfig.gpu_memory_utilization).

Called once, after the weights are on the device and before the cache is allocated:

    budget = utilization * total memory - memory in use now (weights, CUDA context, other
             processes) - a reserve for activations, logits and CUDA graphs
    num_blocks = budget // bytes per block (K and V of every layer)

The reserve is an upper estimate rather than a profiled forward: the step's largest transient
tensors are known in closed form (the decode gather of SDPA's fallback, the logits and their
copies, one layer's activations over the token budget), plus a fixed margin for the CUDA graph
pool, cuBLAS workspaces and fragmentation.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

FIXED_RESERVE_BYTES = 1 << 30  # graph pool, cuBLAS workspaces, allocator fragmentation


@dataclass(frozen=True)
class StepShape:
    """The largest step the engine can run, in the terms that size its transient memory."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    dtype_bytes: int


def activation_reserve_bytes(s: StepShape) -> int:
    # decode: K and V of every running request gathered to the full context (SDPA fallback), one layer at a time
    gather = 2 * s.max_num_seqs * s.max_model_len * s.num_kv_heads * s.head_dim * s.dtype_bytes
    logits = 4 * s.max_num_seqs * s.vocab_size * 4  # float32 logits, the sampler's copies, softmax
    # one layer over the whole token budget: residual, norm, qkv, attention, gate/up, product, down, in dtype
    per_token = (5 * s.hidden_size + (s.num_heads + 2 * s.num_kv_heads) * s.head_dim
                 + 3 * s.intermediate_size) * s.dtype_bytes
    # packed prefill attention: bool mask and its float bias, num_queries x num_keys per query head group
    keys = min(s.max_num_batched_tokens * 8, s.max_num_seqs * s.max_model_len)
    packed_mask = s.max_num_batched_tokens * keys * (1 + 4) * (s.num_heads // s.num_kv_heads)
    return gather + logits + 2 * per_token * s.max_num_batched_tokens + packed_mask + FIXED_RESERVE_BYTES


def num_blocks_from_free_memory(device: torch.device, utilization: float, bytes_per_block: int,
                                shape: StepShape) -> int:
    """How many KV blocks fit in `utilization` of the device's memory; ValueError if not even 2."""
    free, total = torch.cuda.mem_get_info(device)
    in_use = total - free
    reserve = activation_reserve_bytes(shape)
    budget = int(utilization * total) - in_use - reserve
    num_blocks = budget // bytes_per_block
    logger.info("KV cache: %.1f GiB of %.1f GiB (utilization %.2f, %.1f GiB in use, %.1f GiB reserved) = %d blocks",
                max(budget, 0) / 2**30, total / 2**30, utilization, in_use / 2**30, reserve / 2**30, num_blocks)
    if num_blocks < 2:
        raise ValueError(
            f"no room for a KV cache: {utilization:.0%} of {total / 2**30:.1f} GiB is "
            f"{utilization * total / 2**30:.1f} GiB, but {in_use / 2**30:.1f} GiB is in use and "
            f"{reserve / 2**30:.1f} GiB is reserved for activations; raise gpu_memory_utilization, lower "
            f"max_num_seqs / max_model_len, or set num_blocks")
    return int(num_blocks)
