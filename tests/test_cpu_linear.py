"""bf16 linear layers pre-packed for oneDNN (engine/cpu_linear.py)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine import cpu_linear
from engine.cpu_linear import PackedLinear, can_pack, pack_linear, pack_linears

needs_packing = pytest.mark.skipif(not can_pack(torch.zeros(1, dtype=torch.bfloat16)),
                                   reason="torch here has no oneDNN weight packing")


@needs_packing
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 64, 300])
def test_packed_layer_computes_what_f_linear_does(rows, bias):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(200, 96, generator=gen).bfloat16()
    b = torch.randn(200, generator=gen).bfloat16() if bias else None
    packed = pack_linear(weight, b)
    assert isinstance(packed, PackedLinear)
    x = torch.randn(rows, 96, generator=gen).bfloat16()
    got, expected = packed(x), F.linear(x, weight, b)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 200)
    torch.testing.assert_close(got.float(), expected.float(), rtol=2 ** -7, atol=1e-3)  # one bf16 rounding
    strided = torch.randn(rows, 2 * 96, generator=gen).bfloat16()[:, :96]  # a column slice, as views arrive
    torch.testing.assert_close(packed(strided).float(), F.linear(strided, weight, b).float(), rtol=2 ** -7, atol=1e-3)


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


def test_the_served_model_reads_every_weight_once(llm, model_dir):
    """bf16 on CPU: the decoder's matmuls are packed and the roofline still counts each weight once."""
    from bench.roofline import weight_bytes
    model = llm.engine.runner.model
    dtype = next(model.parameters()).dtype
    if dtype == torch.bfloat16 and can_pack(next(model.parameters())):
        assert isinstance(model.layers[0].qkv_proj, PackedLinear) and model.packed_lm_head is not None
    assert model.weight_bytes() == weight_bytes(model_dir, str(dtype).removeprefix("torch."))
