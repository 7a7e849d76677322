"""The CUDA attention backends' math, on the CPU: SDPA over the paged cache (the CUDA fallback),
the flash-attn backend's calls (against a stand-in with flash-attn 2's documented semantics), and
the backend choice on a CUDA device."""
from __future__ import annotations

import logging
import sys
import types

import numpy as np
import pytest
import torch

from engine.attention import AttentionInputs, get_attention_backend, write_kv
from engine.cpu_attention import CpuAttentionBackend
from engine.flash_attention import FlashAttentionBackend
from engine.sdpa_attention import SdpaAttentionBackend

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


def reference(inputs: AttentionInputs, cache: torch.Tensor, q, k, v) -> torch.Tensor:
    """Token by token, in float64: write K/V, then each query attends to its request's keys up to
    its own position (query head h reads KV head h // group)."""
    cache = cache.double().clone()
    write_kv(cache, k.double(), v.double(), inputs.slot_mapping)
    group = NUM_HEADS // NUM_KV_HEADS
    out = torch.empty(q.shape, dtype=torch.float64)
    qsl = inputs.query_start_loc
    for row in range(len(qsl) - 1):
        for t in range(qsl[row], qsl[row + 1]):
            position = int(inputs.num_computed_tokens[row]) + t - qsl[row]
            keys = np.arange(position + 1)
            slots = inputs.block_table[row, keys // BLOCK_SIZE].long() * BLOCK_SIZE + torch.from_numpy(keys % BLOCK_SIZE)
            for h in range(NUM_HEADS):
                kk = cache[0].view(-1, NUM_KV_HEADS, HEAD_DIM)[slots, h // group]
                vv = cache[1].view(-1, NUM_KV_HEADS, HEAD_DIM)[slots, h // group]
                weights = torch.softmax(kk @ q[t, h].double() / HEAD_DIM ** 0.5, dim=0)
                out[t, h] = weights @ vv
    return out


STEPS = {
    "mixed": ([13, 0, 20, 0, 7], [1, 9, 5, 1, 3]),  # decode, fresh prompt, prefix hit, one-token prompt, chunk
    "decodes": ([13, 3, 31, 0], [1, 1, 1, 1]),
    "prompts": ([0, 8, 0], [7, 4, 16]),
    "long chunks": ([0, 10, 5], [20, 24, 2]),  # longer than the CPU kernel's runs: SDPA, fresh and cached
}


@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("backend_cls", [SdpaAttentionBackend, CpuAttentionBackend])
def test_matches_the_reference(step, backend_cls):
    inputs, cache, q, k, v = make_step(*STEPS[step])
    backend = backend_cls()
    ours = cache.clone()
    out = backend.forward(q, k, v, ours, backend.build_metadata(inputs))
    torch.testing.assert_close(out.double(), reference(inputs, cache, q, k, v), atol=1e-5, rtol=1e-5)
    written = cache.clone()
    write_kv(written, k, v, inputs.slot_mapping)
    assert torch.equal(ours, written)  # this step's K/V landed in their slots, nothing else moved


def test_decode_metadata_from_device_tensors_gives_the_same_output():
    inputs, cache, q, k, v = make_step(*STEPS["decodes"])
    backend = SdpaAttentionBackend()
    expected = backend.forward(q, k, v, cache.clone(), backend.build_metadata(inputs))
    # the graph path: the whole padded block table row, int32 seq_lens
    metadata = backend.decode_metadata(inputs.slot_mapping, inputs.block_table,
                                       torch.from_numpy(inputs.seq_lens))
    torch.testing.assert_close(backend.forward(q, k, v, cache.clone(), metadata), expected)


def fake_flash_attn() -> types.ModuleType:
    """flash-attn 2's two paged entry points, written from its documentation in plain torch:
    k_cache/v_cache [num_blocks, block_size, kv_heads, dim]; causal masks aligned to the end of
    each sequence's keys; GQA by head index // group."""

    def attend(q, k_cache, v_cache, block_row, seq_len):  # q [n, H, D], the last n keys' queries
        n = q.shape[0]
        num_blocks = -(-seq_len // k_cache.shape[1])
        keys = k_cache[block_row[:num_blocks].long()].reshape(-1, *k_cache.shape[2:])[:seq_len]
        values = v_cache[block_row[:num_blocks].long()].reshape(-1, *v_cache.shape[2:])[:seq_len]
        group = q.shape[1] // keys.shape[1]
        keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q, keys) / q.shape[-1] ** 0.5
        causal = torch.arange(seq_len)[None, :] <= torch.arange(seq_len - n, seq_len)[:, None]
        weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        return torch.einsum("hqk,khd->qhd", weights, values)

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                               block_table=None, **_):
        assert causal and block_table is not None and block_table.dtype == torch.int32
        assert cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32
        seq_lens = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).tolist()
        assert max_seqlen_k == max(seq_lens) and max_seqlen_q == int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
        return torch.cat([attend(q[cu_seqlens_q[i]:cu_seqlens_q[i + 1]], k, v, block_table[i], seq_lens[i])
                          for i in range(len(seq_lens))])

    def flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, block_table=None, causal=False, **_):
        assert causal and q.shape[1] == 1 and cache_seqlens.dtype == torch.int32
        return torch.stack([attend(q[i], k_cache, v_cache, block_table[i], int(cache_seqlens[i]))
                            for i in range(q.shape[0])])

    module = types.ModuleType("flash_attn")
    module.flash_attn_varlen_func = flash_attn_varlen_func
    module.flash_attn_with_kvcache = flash_attn_with_kvcache
    return module


@pytest.mark.parametrize("step", list(STEPS))
def test_flash_attention_backend_calls(step):
    inputs, cache, q, k, v = make_step(*STEPS[step])
    backend = FlashAttentionBackend(fake_flash_attn())
    out = backend.forward(q, k, v, cache.clone(), backend.build_metadata(inputs))
    torch.testing.assert_close(out.double(), reference(inputs, cache, q, k, v), atol=1e-5, rtol=1e-5)
    if step == "decodes":
        metadata = backend.decode_metadata(inputs.slot_mapping, inputs.block_table, torch.from_numpy(inputs.seq_lens))
        torch.testing.assert_close(backend.forward(q, k, v, cache.clone(), metadata), out)


@pytest.fixture
def without_flash_attn(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # import flash_attn raises ImportError


def test_cuda_without_flash_attn_falls_back_to_sdpa_with_a_warning(without_flash_attn, caplog):
    cuda = torch.device("cuda")  # choosing touches no device
    with caplog.at_level(logging.WARNING, logger="engine.flash_attention"):
        assert isinstance(get_attention_backend(cuda, 16, "auto"), SdpaAttentionBackend)
    assert "flash-attn is not installed" in caplog.text and "torch SDPA" in caplog.text
    with pytest.raises(ValueError, match="flash-attn is not installed.*pip install"):
        get_attention_backend(cuda, 16, "flash_attn")
    assert isinstance(get_attention_backend(cuda, 16, "torch"), SdpaAttentionBackend)


def test_flash_attn_needs_blocks_of_256(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "flash_attn", fake_flash_attn())
    cuda = torch.device("cuda")
    assert isinstance(get_attention_backend(cuda, 256, "auto"), FlashAttentionBackend)
    with caplog.at_level(logging.WARNING, logger="engine.flash_attention"):
        assert isinstance(get_attention_backend(cuda, 16, "auto"), SdpaAttentionBackend)
    assert "divisible by 256" in caplog.text
    with pytest.raises(ValueError, match="divisible by 256"):
        get_attention_backend(cuda, 16, "flash_attn")


def test_cpu_keeps_the_cpu_backend():
    assert isinstance(get_attention_backend(torch.device("cpu")), CpuAttentionBackend)
