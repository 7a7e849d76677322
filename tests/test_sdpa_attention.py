"""The CUDA attention backends' math, on the CPU: SDPA over the paged cache (the CUDA fallback),
the flash-attn backend's calls (against a stand-in with flash-attn 2's documented semantics), and
the backend choice on a CUDA device."""
from __future__ import annotations

import logging
import sys
import types

import pytest
import torch

from attention_steps import STEPS, make_step, reference, write_kv_by_hand

from engine.attention import get_attention_backend
from engine.attention.cpu import CpuAttentionBackend
from engine.attention.flash import FlashAttentionBackend
from engine.attention.sdpa import SdpaAttentionBackend

@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("backend_cls", [SdpaAttentionBackend, CpuAttentionBackend])
def test_matches_the_reference(step, backend_cls):
    inputs, cache, q, k, v = make_step(*STEPS[step])
    backend = backend_cls()
    ours = cache.clone()
    out = backend.forward(q, k, v, ours, backend.build_metadata(inputs))
    torch.testing.assert_close(out.double(), reference(inputs, cache, q, k, v), atol=1e-5, rtol=1e-5)
    assert torch.equal(ours, write_kv_by_hand(cache, k, v, inputs.slot_mapping))  # this step's K/V landed in their slots, nothing else moved


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
    with caplog.at_level(logging.WARNING, logger="engine.attention"):
        assert isinstance(get_attention_backend(cuda, 16, "auto"), SdpaAttentionBackend)
    assert "flash-attn is not installed" in caplog.text and "torch SDPA" in caplog.text
    with pytest.raises(ValueError, match="flash-attn is not installed.*pip install"):
        get_attention_backend(cuda, 16, "flash_attn")
    assert isinstance(get_attention_backend(cuda, 16, "torch"), SdpaAttentionBackend)


def test_flash_attn_needs_blocks_of_256(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "flash_attn", fake_flash_attn())
    cuda = torch.device("cuda")
    assert isinstance(get_attention_backend(cuda, 256, "auto"), FlashAttentionBackend)
    with caplog.at_level(logging.WARNING, logger="engine.attention"):
        assert isinstance(get_attention_backend(cuda, 16, "auto"), SdpaAttentionBackend)
    assert "divisible by 256" in caplog.text
    with pytest.raises(ValueError, match="divisible by 256"):
        get_attention_backend(cuda, 16, "flash_attn")


def test_cpu_keeps_the_cpu_backend():
    assert isinstance(get_attention_backend(torch.device("cpu")), CpuAttentionBackend)
