"""One attention step over a paged cache, built by hand, and a float64 reference that shares no
code with the backends (tests/engine/test_sdpa_attention.py, tests/engine/test_cpu_attention.py)."""
from __future__ import annotations

import numpy as np
import torch

from engine.attention import AttentionInputs

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS = 6, 2, 8, 4, 40


def make_step(num_computed: list[int], num_scheduled: list[int], seed: int = 0):
    """Inputs of one step over a cache whose earlier K/V are random; each request owns distinct
    blocks in a shuffled order (so slot arithmetic mistakes show)."""
    gen = torch.Generator().manual_seed(seed)
    cache = torch.randn(2, NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    free = torch.randperm(NUM_BLOCKS - 1, generator=gen).add(1).tolist()  # block 0 is never used
    seq_lens = np.array(num_computed) + np.array(num_scheduled)
    max_blocks = int(-(-seq_lens.max() // BLOCK_SIZE)) + 1
    block_table = np.zeros((len(seq_lens), max_blocks), dtype=np.int32)
    for row, seq_len in enumerate(seq_lens):
        for b in range(-(-seq_len // BLOCK_SIZE)):
            block_table[row, b] = free.pop()
    qsl = np.zeros(len(seq_lens) + 1, dtype=np.int32)
    qsl[1:] = np.cumsum(num_scheduled)
    positions = np.concatenate([np.arange(c, c + s) for c, s in zip(num_computed, num_scheduled)])
    rows = np.repeat(np.arange(len(seq_lens)), num_scheduled)
    slot_mapping = block_table[rows, positions // BLOCK_SIZE].astype(np.int64) * BLOCK_SIZE + positions % BLOCK_SIZE
    inputs = AttentionInputs(torch.from_numpy(slot_mapping), qsl, np.array(num_computed, dtype=np.int32),
                             seq_lens.astype(np.int32), torch.from_numpy(block_table), BLOCK_SIZE)
    num_tokens = int(qsl[-1])
    q = torch.randn(num_tokens, NUM_HEADS, HEAD_DIM, generator=gen)
    k = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    v = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    return inputs, cache, q, k, v


def reference(inputs: AttentionInputs, cache: torch.Tensor, q, k, v, scale: float | None = None,
              sliding_window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    """Token by token, in float64: write K/V, then each query attends to its request's keys up to
    its own position (query head h reads KV head h // group); with a window, only the last
    `sliding_window` of them; with a soft cap, scores become softcap * tanh(scores / softcap)."""
    scale = HEAD_DIM ** -0.5 if scale is None else scale
    cache = write_kv_by_hand(cache.double(), k.double(), v.double(), inputs.slot_mapping)
    group = NUM_HEADS // NUM_KV_HEADS
    out = torch.empty(q.shape, dtype=torch.float64)
    qsl = inputs.query_start_loc
    for row in range(len(qsl) - 1):
        for t in range(qsl[row], qsl[row + 1]):
            position = int(inputs.num_computed_tokens[row]) + t - qsl[row]
            keys = np.arange(max(0, position + 1 - sliding_window) if sliding_window else 0, position + 1)
            slots = inputs.block_table[row, keys // BLOCK_SIZE].long() * BLOCK_SIZE + torch.from_numpy(keys % BLOCK_SIZE)
            for h in range(NUM_HEADS):
                kk = cache[0].view(-1, NUM_KV_HEADS, HEAD_DIM)[slots, h // group]
                vv = cache[1].view(-1, NUM_KV_HEADS, HEAD_DIM)[slots, h // group]
                scores = kk @ q[t, h].double() * scale
                if softcap:
                    scores = torch.tanh(scores / softcap) * softcap
                weights = torch.softmax(scores, dim=0)
                out[t, h] = weights @ vv
    return out


STEPS = {
    "mixed": ([13, 0, 20, 0, 7], [1, 9, 5, 1, 3]),  # decode, fresh prompt, prefix hit, one-token prompt, chunk
    "decodes": ([13, 3, 31, 0], [1, 1, 1, 1]),
    "prompts": ([0, 8, 0], [7, 4, 16]),
    "long chunks": ([0, 10, 5], [20, 24, 2]),  # whole prompts and chunks, fresh and cached (SDPA without the kernel)
}


def write_kv_by_hand(cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping) -> torch.Tensor:
    """A copy of `cache` with token t's K/V at slot slot_mapping[t] (block slot // size, offset slot % size)."""
    cache = cache.clone()
    block_size = cache.shape[2]
    for t, slot in enumerate(torch.as_tensor(slot_mapping).tolist()):
        cache[0, slot // block_size, slot % block_size] = k[t]
        cache[1, slot // block_size, slot % block_size] = v[t]
    return cache
