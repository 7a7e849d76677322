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

from engine.attention import AttentionOptions, get_attention_backend
from engine.attention.cpu import CpuAttentionBackend
from engine.attention.flash import FlashAttentionBackend, flash_layer_args
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

    def attend(q, k_cache, v_cache, block_row, seq_len, softmax_scale=None, window_size=(-1, -1), softcap=0.0):
        """q [n, H, D]: the queries of the last n keys; window_size (left, right) keys around each query."""
        n = q.shape[0]
        num_blocks = -(-seq_len // k_cache.shape[1])
        keys = k_cache[block_row[:num_blocks].long()].reshape(-1, *k_cache.shape[2:])[:seq_len]
        values = v_cache[block_row[:num_blocks].long()].reshape(-1, *v_cache.shape[2:])[:seq_len]
        group = q.shape[1] // keys.shape[1]
        keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        scores = torch.einsum("qhd,khd->hqk", q, keys) * scale
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        key_pos, query_pos = torch.arange(seq_len)[None, :], torch.arange(seq_len - n, seq_len)[:, None]
        causal = key_pos <= query_pos
        if window_size[0] >= 0:
            causal &= key_pos >= query_pos - window_size[0]
        weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        return torch.einsum("hqk,khd->qhd", weights, values)

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                               block_table=None, **layer_args):
        assert causal and block_table is not None and block_table.dtype == torch.int32
        assert cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32
        seq_lens = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).tolist()
        assert max_seqlen_k == max(seq_lens) and max_seqlen_q == int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
        return torch.cat([attend(q[cu_seqlens_q[i]:cu_seqlens_q[i + 1]], k, v, block_table[i], seq_lens[i],
                                 **layer_args) for i in range(len(seq_lens))])

    def flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, block_table=None, causal=False,
                                **layer_args):
        assert causal and q.shape[1] == 1 and cache_seqlens.dtype == torch.int32
        return torch.stack([attend(q[i], k_cache, v_cache, block_table[i], int(cache_seqlens[i]), **layer_args)
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


# a window shorter than the longest context, a cap below the largest scores, a scale that is not head_dim's
LAYER_OPTIONS = {
    "window": AttentionOptions(sliding_window=6),
    "softcap": AttentionOptions(softcap=1.5),
    "scale, window and softcap": AttentionOptions(scale=0.2, sliding_window=5, softcap=2.0),
}


def _cpu_without_kernels():
    backend = CpuAttentionBackend()
    backend.kernels = None
    return backend


@pytest.mark.parametrize("options", list(LAYER_OPTIONS))
@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("make_backend", [SdpaAttentionBackend, CpuAttentionBackend, _cpu_without_kernels,
                                          lambda: FlashAttentionBackend(fake_flash_attn())],
                         ids=["sdpa", "cpu", "cpu-torch", "flash"])
def test_windows_softcaps_and_scales_reach_every_backend(make_backend, step, options):
    inputs, cache, q, k, v = make_step(*STEPS[step])
    opts = LAYER_OPTIONS[options]
    backend = make_backend()
    ours = cache.clone()
    out = backend.forward(q, k, v, ours, backend.build_metadata(inputs), opts)
    expected = reference(inputs, cache, q, k, v, opts.scale, opts.sliding_window, opts.softcap)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(ours, write_kv_by_hand(cache, k, v, inputs.slot_mapping))
    if step == "decodes" and backend.supports_decode_metadata:  # the CUDA-graph path takes them too
        metadata = backend.decode_metadata(inputs.slot_mapping, inputs.block_table, torch.from_numpy(inputs.seq_lens))
        torch.testing.assert_close(backend.forward(q, k, v, cache.clone(), metadata, opts), out)


def test_flash_attn_gets_the_layer_options():
    assert flash_layer_args(AttentionOptions(), 64) == {"softmax_scale": 0.125, "window_size": (-1, 0), "softcap": 0.0}
    assert flash_layer_args(AttentionOptions(scale=0.5, sliding_window=4096, softcap=50.0), 64) == {
        "softmax_scale": 0.5, "window_size": (4095, 0), "softcap": 50.0}


def test_attention_options_reject_negative_values():
    with pytest.raises(ValueError, match="sliding_window"):
        AttentionOptions(sliding_window=-1)
    with pytest.raises(ValueError, match="softcap"):
        AttentionOptions(softcap=-2.0)


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
