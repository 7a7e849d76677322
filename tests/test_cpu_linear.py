"""bf16 linear layers pre-packed for oneDNN (engine/kernels/cpu_linear.py)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels import cpu_linear
from engine.kernels.cpu_linear import PackedLinear, can_pack, pack_linear, pack_linears

needs_packing = pytest.mark.skipif(not can_pack(torch.zeros(1, dtype=torch.bfloat16)),
                                   reason="torch here has no oneDNN weight packing")


@needs_packing
@pytest.mark.parametrize("out_features", [208, 200])  # the small-batch kernel takes multiples of 16
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 16, 17, 64, 300])
def test_packed_layer_computes_what_f_linear_does(rows, bias, out_features):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(out_features, 96, generator=gen).bfloat16()
    b = torch.randn(out_features, generator=gen).bfloat16() if bias else None
    packed = pack_linear(weight, b)
    assert isinstance(packed, PackedLinear)
    if out_features % 16:
        assert packed.small_batch_weight is None
    x = torch.randn(rows, 96, generator=gen).bfloat16()
    got, expected = packed(x), F.linear(x, weight, b)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, out_features)
    torch.testing.assert_close(got.float(), expected.float(), rtol=2 ** -7, atol=1e-3)  # one bf16 rounding
    strided = torch.randn(rows, 2 * 96, generator=gen).bfloat16()[:, :96]  # a column slice, as views arrive
    torch.testing.assert_close(packed(strided).float(), F.linear(strided, weight, b).float(), rtol=2 ** -7, atol=1e-3)


@pytest.mark.parametrize("rows", range(1, 17))
def test_small_batch_kernel_matches_f_linear(kernels, rows):
    if not kernels.small_batch_gemm_available():
        pytest.skip("the CPU kernels were built without AVX-512 BF16 here")
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 1536, generator=gen).bfloat16()  # K = SmolLM2's MLP width: many column pairs
    bias = torch.randn(96, generator=gen).bfloat16() if rows % 2 else None
    x = torch.randn(rows, 1536, generator=gen).bfloat16()
    got = kernels.small_batch_gemm(x, kernels.pack_small_batch_weight(weight), 96, bias)
    expected = F.linear(x, weight, bias)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 96)
    torch.testing.assert_close(got.float(), expected.float(), rtol=2 ** -7, atol=2e-2)  # bf16 output rounding


def test_small_batch_kernel_rejects_what_it_cannot_take(kernels):
    with pytest.raises(RuntimeError, match="multiple of 16"):
        kernels.pack_small_batch_weight(torch.zeros(20, 8, dtype=torch.bfloat16))
    if not kernels.small_batch_gemm_available():
        return
    packed = kernels.pack_small_batch_weight(torch.zeros(32, 8, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="1 to 16 rows"):
        kernels.small_batch_gemm(torch.zeros(17, 8, dtype=torch.bfloat16), packed, 32)
    with pytest.raises(RuntimeError, match="packed"):
        kernels.small_batch_gemm(torch.zeros(1, 10, dtype=torch.bfloat16), packed, 32)
    with pytest.raises(RuntimeError, match="bf16"):
        kernels.small_batch_gemm(torch.zeros(1, 8), packed, 32)
    with pytest.raises(RuntimeError, match="bias"):
        kernels.small_batch_gemm(torch.zeros(1, 8, dtype=torch.bfloat16), packed, 32, torch.zeros(31, dtype=torch.bfloat16))


def test_float32_and_other_devices_stay_plain():
    assert pack_linear(torch.randn(8, 8)) is None  # fp32 is the exact-comparison mode: MKL as before
    assert pack_linear(torch.randn(8, 8, dtype=torch.float16)) is None


@needs_packing
def test_pack_linears_replaces_every_linear_and_keeps_the_outputs():
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Sequential(nn.Linear(64, 16, bias=False))).bfloat16()
    x = torch.randn(5, 32).bfloat16()
    with torch.no_grad():
        before = model(x)
        assert pack_linears(model) == 2
        after = model(x)
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    torch.testing.assert_close(after.float(), before.float(), rtol=2 ** -7, atol=1e-2)


@needs_packing
def test_a_packed_layer_that_disagrees_is_not_used(monkeypatch, caplog):
    monkeypatch.setattr(PackedLinear, "forward", lambda self, x: torch.zeros(x.shape[0], self.out_features) + 1)
    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16)).bfloat16()
    assert pack_linears(model) == 0
    assert all(isinstance(m, nn.Linear) for m in model)
    assert "plain bf16 matmuls" in caplog.text
    monkeypatch.setattr(cpu_linear.torch.backends.mkldnn, "is_available", lambda: False)
    assert pack_linear(torch.zeros(4, 4, dtype=torch.bfloat16)) is None


@pytest.mark.slow
def test_the_served_model_reads_every_weight_once(llm, model_dir):
    """bf16 on CPU: the decoder's matmuls are packed and the roofline still counts each weight once."""
    from bench.roofline import weight_bytes
    model = llm.engine.runner.model
    dtype = next(model.parameters()).dtype
    packs = dtype == torch.bfloat16 and can_pack(next(model.parameters()))
    assert isinstance(model.layers[0].qkv_proj, PackedLinear) == packs
    assert (model.packed_lm_head is not None) == packs
    assert model.weight_bytes() == weight_bytes(model_dir, str(dtype).removeprefix("torch."))
