"""The CPU attention backend: its compiled paged decode kernel, its torch fallback, bf16 caches."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine import cpu_kernels
from engine.attention import write_kv
from engine.cpu_attention import CpuAttentionBackend
from tests.test_sdpa_attention import STEPS, make_step, reference


def paged_reference(q, cache, block_table, seq_lens):
    """Each request alone, in float64: gather its blocks, then plain softmax attention."""
    block_size, num_kv_heads, head_dim = cache.shape[2:]
    out = []
    for i in range(q.shape[0]):
        length = int(seq_lens[i])
        blocks = block_table[i, :-(-length // block_size)].long()
        k = cache[0][blocks].reshape(-1, num_kv_heads, head_dim)[:length].double().transpose(0, 1)
        v = cache[1][blocks].reshape(-1, num_kv_heads, head_dim)[:length].double().transpose(0, 1)
        out.append(F.scaled_dot_product_attention(q[i].double().unsqueeze(1), k, v, enable_gqa=True).squeeze(1))
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_reads_scattered_blocks_of_any_length(kernels, dtype):
    gen = torch.Generator().manual_seed(1)
    cache = torch.randn(2, 300, 16, 3, 64, generator=gen).to(dtype)
    seq_lens = torch.randint(1, 400, (21,), generator=gen, dtype=torch.int32)
    seq_lens[:4] = torch.tensor([1, 16, 17, 400], dtype=torch.int32)  # one key, block edges, the whole table
    block_table = torch.stack([torch.randperm(300, generator=gen)[:25] for _ in range(21)]).int()
    q = torch.randn(21, 9, 64, generator=gen) * 3  # peaked softmax: the max subtraction matters
    out = kernels.paged_decode_attention(q, cache, block_table, seq_lens, 64 ** -0.5)
    torch.testing.assert_close(out.double(), paged_reference(q, cache, block_table, seq_lens), atol=1e-5, rtol=1e-5)


def test_kernel_rejects_mismatched_shapes(kernels):
    cache = torch.zeros(2, 4, 16, 3, 64)
    with pytest.raises(RuntimeError, match="head shapes"):
        kernels.paged_decode_attention(torch.zeros(1, 8, 64), cache, torch.zeros(1, 1, dtype=torch.int32),
                                       torch.ones(1, dtype=torch.int32), 1.0)
    with pytest.raises(RuntimeError, match="int32"):
        kernels.paged_decode_attention(torch.zeros(1, 9, 64), cache, torch.zeros(1, 1, dtype=torch.int64),
                                       torch.ones(1, dtype=torch.int32), 1.0)


@pytest.mark.parametrize("step", list(STEPS))
def test_torch_fallback_matches_the_reference(step):
    inputs, cache, q, k, v = make_step(*STEPS[step])
    backend = CpuAttentionBackend()
    backend.kernels = None  # as on a machine without a compiler
    out = backend.forward(q, k, v, cache.clone(), backend.build_metadata(inputs))
    torch.testing.assert_close(out.double(), reference(inputs, cache, q, k, v), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("step", list(STEPS))
def test_bf16_model_with_bf16_cache(kernels, step):
    """A bf16 model writes bf16 K/V and gets bf16 outputs; the math inside is fp32."""
    inputs, cache, q, k, v = make_step(*STEPS[step])
    backend = CpuAttentionBackend()
    assert backend.kv_cache_dtype(torch.bfloat16) == torch.bfloat16
    cache16, q16, k16, v16 = cache.bfloat16(), q.bfloat16(), k.bfloat16(), v.bfloat16()
    ours = cache16.clone()
    out = backend.forward(q16, k16, v16, ours, backend.build_metadata(inputs))
    assert out.dtype == torch.bfloat16
    expected = reference(inputs, cache16.float(), q16.float(), k16.float(), v16.float())
    torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=2e-2)  # bf16 output rounding
    written = cache16.clone()
    write_kv(written, k16, v16, inputs.slot_mapping)
    assert torch.equal(ours, written)


def test_without_kernels_the_cache_is_fp32(monkeypatch):
    monkeypatch.setenv("FORMWORK_CPU_KERNELS", "0")
    monkeypatch.setattr(cpu_kernels, "_state", {})
    backend = CpuAttentionBackend()
    assert backend.kernels is None
    assert backend.kv_cache_dtype(torch.bfloat16) == torch.float32
