"""The int8 GEMM (engine/kernels/csrc/int8_gemm.cpp) and the int8 linear layers over it."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch import nn

from engine.kernels.int8_linear import ACTIVATION_GROUP, GROUP, Int8Linear, quantize_linear, quantize_linears

# (rows, K, N): rows around every tile edge (8 rows AVX-512, 4 AVX2), K in whole and partial groups
# of 32 and 64-value paddings, N in whole and partial blocks and panels (16 and 48 columns)
SHAPES = [(m, 96, 208) for m in (1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 64, 65)] + [
    (1, 576, 960), (3, 20, 17), (9, 77, 49), (40, 1536, 96), (64, 576, 1536), (300, 64, 50), (513, 128, 200)]


def unpack(packed: torch.Tensor, scales: torch.Tensor, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed layout read back: int8 [n, k] and the scales [n, groups] (widened to fp32)."""
    blocks, quads = packed.shape[:2]
    assert packed.dtype == torch.uint8  # w + 128
    values = (packed.permute(0, 2, 1, 3).reshape(blocks * 16, quads * 4)[:n, :k].int() - 128).to(torch.int8)
    return values, scales.permute(0, 2, 1).reshape(blocks * 16, -1)[:n].float()


def reference(qx, x_scales, qw, w_scales, bias, group=ACTIVATION_GROUP):
    """The int8 product group by group in int64 (exact), each group scaled by x's and w's scales."""
    m, k = qx.shape
    num_groups = -(-k // group)
    padded = num_groups * group
    qx = torch.nn.functional.pad(qx.long(), (0, padded - k)).view(m, num_groups, group)
    qw = torch.nn.functional.pad(qw.long(), (0, padded - k)).view(qw.shape[0], num_groups, group)
    sums = torch.einsum("mgk,ngk->mng", qx, qw)  # [m, n, groups], int64: exact
    w_scales = w_scales[:, :num_groups].expand(-1, num_groups)
    scale = x_scales[:, None, :num_groups] * w_scales[None]  # fp32, as the kernel forms it
    y = (sums.double() * scale.double()).sum(-1)
    return y if bias is None else y + bias.double()


@pytest.mark.parametrize("group", [GROUP, ACTIVATION_GROUP])
def test_rows_are_quantized_per_group(kernels, group):
    x = torch.randn(5, 77, generator=torch.Generator().manual_seed(0)).bfloat16()
    x[2] = 0  # a row of zeros: scale 0, values 0
    x[3, 70] = 50.0  # an outlier flattens its own group only
    q, scales = kernels.quantize_rows(x, group)
    num_groups = -(-77 // group)
    assert q.dtype == torch.int8 and q.shape == (5, 77) and scales.shape == (5, num_groups)
    groups = torch.nn.functional.pad(x.float(), (0, num_groups * group - 77)).view(5, num_groups, group)
    amax = groups.abs().amax(-1)
    torch.testing.assert_close(scales, amax / 127, rtol=2 ** -23, atol=0)
    expected = torch.where(amax[..., None] > 0, groups * (127 / amax[..., None]), 0).round().view(5, -1)[:, :77]
    assert (q.float() - expected).abs().max() <= 1  # a value at .5 may round either way after 127 / amax
    assert (q.float() != expected).float().mean() < 0.01
    assert torch.equal(q[2], torch.zeros(77, dtype=torch.int8)) and not scales[2].any()
    assert q[3, 70] == 127 and q[3, :group].abs().max() == 127  # other groups keep their own scale
    with pytest.raises(RuntimeError, match="group"):
        kernels.quantize_rows(x, 16)


@pytest.mark.parametrize("rows,k,n", SHAPES)
def test_int8_gemm_is_the_int8_product_scaled(kernels, rows, k, n):
    gen = torch.Generator().manual_seed(rows * 1000 + k + n)
    weight = torch.randn(n, k, generator=gen)
    bias = torch.randn(n, generator=gen) if (rows + n) % 2 else None
    x = torch.randn(rows, 2 * k + 3, generator=gen).bfloat16()[:, 3:k + 3]  # strided rows, odd offset
    packed, scales = kernels.pack_int8_weight(weight)
    assert packed.shape == (-(-n // 16), -(-k // 64) * 16, 16, 4) and scales.shape == (-(-n // 16), 1, 16)
    qw, w_scales = unpack(packed, scales, n, k)
    torch.testing.assert_close(w_scales[:, 0], weight.abs().amax(1) / 127, rtol=2 ** -23, atol=0)
    assert (qw.float() * w_scales - weight).abs().max() <= w_scales.max() / 2 * 1.001
    got = kernels.int8_gemm(x, packed, scales, n, bias, True)
    assert got.dtype == torch.float32 and got.shape == (rows, n)
    qx, x_scales = kernels.quantize_rows(x, ACTIVATION_GROUP)  # per-channel weights: x per 64 values
    expected = reference(qx, x_scales, qw, w_scales, bias)
    # the int32 sums are exact: only fp32 roundings of the scaled sums remain (an integer off by one
    # would be ~1/127 of a group's scale, far outside this)
    bound = reference(qx.abs(), x_scales, qw.abs(), w_scales, None if bias is None else bias.abs())
    assert ((got.double() - expected).abs() <= 2 ** -21 * bound + 1e-30).all()
    assert torch.equal(kernels.int8_gemm(x, packed, scales, n, bias, False), got.bfloat16())


def test_one_group_is_the_product_bit_for_bit(kernels):
    """K within one group: one int32 sum per output, one fp32 product and one addition, as torch does them."""
    gen = torch.Generator().manual_seed(1)
    weight, bias = torch.randn(40, 32, generator=gen), torch.randn(40, generator=gen)
    x = torch.randn(9, 32, generator=gen)
    packed, scales = kernels.pack_int8_weight(weight)
    qw, w_scales = unpack(packed, scales, 40, 32)
    qx, x_scales = kernels.quantize_rows(x, ACTIVATION_GROUP)
    sums = (qx.long() @ qw.long().T).float()  # exact: |sums| < 2^24
    expected = sums * (x_scales * w_scales.T) + bias
    assert torch.equal(kernels.int8_gemm(x, packed, scales, 40, bias, False), expected)


def test_a_row_does_not_depend_on_the_batch(kernels):
    """The same row alone and at every place of batches of 2..300 rows: the same bits (below 16
    rows and above, AMX tiles where the CPU has them: the same int32 sums, scaled alike)."""
    gen = torch.Generator().manual_seed(2)
    n, k = 200, 576
    packed, scales = kernels.pack_int8_weight(torch.randn(n, k, generator=gen))
    rows = torch.randn(300, k, generator=gen).bfloat16()
    alone = torch.cat([kernels.int8_gemm(rows[i:i + 1], packed, scales, n, None, True) for i in range(300)])
    for size in (2, 5, 8, 9, 15, 16, 17, 33, 64, 300):
        for start in (0, 300 - size, (300 - size) // 2):
            batch = kernels.int8_gemm(rows[start:start + size], packed, scales, n, None, True)
            assert torch.equal(batch, alone[start:start + size]), (size, start)


def test_q8_0_blocks_are_served_as_they_are(kernels):
    """A GGUF Q8_0 tensor's int8 values and fp16 scales, re-laid but unchanged: the product is the
    int8 product with a scale per 32 values of the weight."""
    from gguf import GGMLQuantizationType, dequantize, quantize
    gen = torch.Generator().manual_seed(3)
    n, k = 70, 96
    weight = torch.randn(n, k, generator=gen).numpy()
    rows = quantize(weight, GGMLQuantizationType.Q8_0)
    packed, scales = kernels.pack_q8_0_weight(torch.from_numpy(rows), k)
    assert scales.shape == (5, 4, 16) and scales.dtype == torch.float16  # K padded to 128: 4 groups, the last one empty
    blocks = rows.reshape(n, k // 32, 34)
    file_scales = torch.from_numpy(blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32))
    qw, w_scales = unpack(packed, scales, n, k)
    assert torch.equal(qw, torch.from_numpy(blocks[..., 2:].copy().view(np.int8).reshape(n, k)))
    assert torch.equal(w_scales[:, :3], file_scales) and not w_scales[:, 3].any()
    layer = Int8Linear.from_q8_0(torch.from_numpy(rows), n, k, torch.bfloat16, kernels)
    ids = torch.tensor([0, 17, 69])
    assert torch.equal(layer.dequantized_rows(ids), torch.from_numpy(dequantize(rows, GGMLQuantizationType.Q8_0))[ids])
    x = torch.randn(6, k, generator=gen)
    qx, x_scales = kernels.quantize_rows(x, GROUP)  # x per 32 values, as the file's weight scales
    expected = reference(qx, x_scales, qw, w_scales, None, GROUP)
    got = kernels.int8_gemm(x, packed, scales, n, None, True)
    bound = reference(qx.abs(), x_scales, qw.abs(), w_scales, None, GROUP)
    assert ((got.double() - expected).abs() <= 2 ** -21 * bound + 1e-30).all()
    with pytest.raises(RuntimeError, match="multiple of 32"):
        kernels.pack_q8_0_weight(torch.from_numpy(rows), 80)


def test_bad_operands_are_refused(kernels):
    packed, scales = kernels.pack_int8_weight(torch.randn(32, 64))
    with pytest.raises(RuntimeError, match="packed"):
        kernels.int8_gemm(torch.zeros(1, 96), packed, scales, 32, None, False)
    with pytest.raises(RuntimeError, match="bias"):
        kernels.int8_gemm(torch.zeros(1, 64), packed, scales, 32, torch.zeros(31), False)
    with pytest.raises(RuntimeError, match="contiguous rows"):
        kernels.int8_gemm(torch.zeros(64, 2).T, packed, scales, 32, None, False)
    assert kernels.int8_gemm(torch.zeros(0, 64), packed, scales, 32, None, False).shape == (0, 32)


def test_the_build_has_the_int8_isa_asked_for(kernels):
    from engine.config import cpu_flags
    if os.environ.get("FORMWORK_CPU_ISA") == "avx2":
        assert kernels.int8_gemm_isa() == "avx2"
    elif "amx_int8" in cpu_flags():
        assert kernels.int8_gemm_isa() == "amx_int8"  # from 16 rows; AVX-512 VNNI below
    elif "avx512_vnni" in cpu_flags():
        assert kernels.int8_gemm_isa() == "avx512_vnni"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_int8_linear_is_close_to_the_float_layer(kernels, dtype):
    gen = torch.Generator().manual_seed(4)
    plain = nn.Linear(128, 80).to(dtype)
    with torch.no_grad():
        plain.weight.copy_(torch.randn(80, 128, generator=gen) * 0.1)
    layer = quantize_linear("probe", plain.weight, plain.bias, lenient=False)
    x = torch.randn(2, 7, 128, generator=gen).to(dtype)
    with torch.no_grad():
        expected, got = plain(x).float(), layer(x)
    assert got.dtype == dtype and got.shape == (2, 7, 80)
    # int8 weights and activations: about 1% of the output's scale
    assert (got.float() - expected).abs().max() < 0.02 * expected.abs().max()
    assert layer.resident_bytes == 80 * 128 + 5 * 16 * 4 + 80 * 4  # int8 values, a scale per column, fp32 bias
    assert torch.allclose(layer.rows(torch.tensor([3])).float(), plain.weight[3:4].float(), atol=0.1 / 127 * 5)


def test_layers_the_kernel_cannot_take_are_named(kernels):
    model = nn.Sequential(nn.Linear(64, 64), nn.Sequential(nn.Linear(64, 48, bias=False), nn.Linear(48, 40)))
    with pytest.raises(ValueError, match=r"layer 1\.1 .*48 input features.* int8:lenient") as raised:
        quantize_linears(model, lenient=False)
    assert "multiple of 32" in str(raised.value)
    assert isinstance(model[0], nn.Linear)  # refused before any layer changed
    count, left = quantize_linears(model, lenient=True)
    assert (count, left) == (2, ["1.1"])
    assert isinstance(model[0], Int8Linear) and isinstance(model[1][0], Int8Linear) and isinstance(model[1][1], nn.Linear)


@pytest.mark.parametrize("num_rows", [1, 5, 40])
def test_q8_0_scales_held_as_fp16_multiply_as_fp32_would(kernels, num_rows):
    """The file's fp16 scales, held as they are and widened in the kernels: the product is the bits of
    the kernels' arithmetic with fp32 scales, sum = fma(float(int32), w_scale * x_scale, sum) group
    after group (each fma taken in float64, where its product is exact, and rounded to fp32), in the
    vector kernels and AMX tiles."""
    from gguf import GGMLQuantizationType, quantize
    gen = torch.Generator().manual_seed(21)
    n, k = 40, 256
    rows = quantize(torch.randn(n, k, generator=gen).numpy(), GGMLQuantizationType.Q8_0)
    layer = Int8Linear.from_q8_0(torch.from_numpy(rows), n, k, torch.bfloat16, kernels)
    assert layer.scales.dtype == torch.float16 and layer.weight_bytes == n * (k + 2 * k // GROUP)
    qw, w_scales = unpack(layer.packed_weight, layer.scales, n, k)
    x = torch.randn(num_rows, k, generator=gen).bfloat16()
    qx, x_scales = kernels.quantize_rows(x, GROUP)
    sums = torch.einsum("mgk,ngk->mng", qx.long().view(num_rows, -1, GROUP), qw.long().view(n, -1, GROUP))
    expected = torch.zeros(num_rows, n)
    for g in range(k // GROUP):
        scale = w_scales[None, :, g] * x_scales[:, g, None]  # fp32
        expected = (sums[:, :, g].double() * scale.double() + expected.double()).float()
    assert torch.equal(layer(x, fp32_out=True), expected)
