"""The 4-bit GEMM (engine/kernels/csrc/int4_gemm.cpp), the GGUF 4-bit block decoding
(engine/models/gguf_blocks.py) and the 4-bit linear layers over them."""
from __future__ import annotations

import pytest
import torch
from quantized_blocks import random_blocks

from engine.kernels.int4_linear import GROUP, Int4Linear
from engine.models.gguf_blocks import decode_four_bit, row_bytes

# (rows, K, N): rows around every tile edge (4 rows vector, 32 AMX and its 16-row tiles), K in whole and partial
# 64-value paddings, N in whole and partial blocks, panels (48 columns) and AMX block pairs
SHAPES = [(m, 96, 208) for m in (1, 2, 3, 4, 5, 8, 15, 16, 17, 31, 32, 33, 64, 65)] + [
    (1, 576, 960), (3, 32, 17), (9, 160, 49), (40, 1536, 96), (64, 576, 1536), (300, 64, 50), (129, 256, 40)]


def random_int4(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """nibbles, and d and m in fp32 that fp16 holds exactly, as the files' own are."""
    gen = torch.Generator().manual_seed(seed)
    nibbles = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    d = (torch.rand(n, k // GROUP, generator=gen) * 0.01).half().float()
    m = (-torch.rand(n, k // GROUP, generator=gen) * 0.08).half().float()
    return nibbles, d, m


def reference(x_q, x_scales, nibbles, d, m, bias=None):
    """x quantized times W = nib * d + m, group by group in float64 from exact int64 sums."""
    rows, k = x_q.shape
    groups = k // GROUP
    q = x_q.long().view(rows, groups, GROUP)
    sums = torch.einsum("mgk,ngk->mng", q, nibbles.long().view(-1, groups, GROUP)).double()
    xs = x_scales[:, :groups].double()[:, None, :]
    y = (sums * d.double()[None] * xs + m.double()[None] * xs * q.sum(-1).double()[:, None, :]).sum(-1)
    return y if bias is None else y + bias.double()


def kernel_arithmetic(x_q, x_scales, nibbles, d, m):
    """The 4-bit GEMM's fp32 operations with fp32 d and m, group after group: sum = fma(float(int32),
    d * xs, sum), then sum = fma(m, float(sum of q) * xs, sum). Each fma is taken in float64, where its
    product is exact, and rounded to fp32."""
    rows, k = x_q.shape
    groups = k // GROUP
    q = x_q.long().view(rows, groups, GROUP)
    sums = torch.einsum("mgk,ngk->mng", q, nibbles.long().view(-1, groups, GROUP)).double()
    xs = x_scales[:, :groups]
    offsets = q.sum(-1).float() * xs
    y = torch.zeros(rows, nibbles.shape[0])
    for g in range(groups):
        scale = d[None, :, g] * xs[:, g, None]  # fp32
        y = (sums[:, :, g] * scale.double() + y.double()).float()
        y = (m[None, :, g].double() * offsets[:, g, None].double() + y.double()).float()
    return y


@pytest.mark.parametrize("tensor_type", ["Q4_0", "Q4_1"])
def test_the_files_d_and_m_are_held_as_fp16_and_multiply_as_fp32_would(kernels, tensor_type):
    """Q4_0 and Q4_1 store d and m as fp16: held so (0.625 bytes a value), widened in the kernels, the
    product is the bits of the same arithmetic with fp32 d and m, in the vector kernels and AMX tiles."""
    rows = random_blocks(tensor_type, 70, 512, seed=11)
    nibbles, d, m = decode_four_bit(rows, tensor_type, 512)
    layer = Int4Linear.from_nibbles(nibbles, d, m, torch.bfloat16, kernels)
    assert layer.scales.dtype == torch.float16
    held = layer.scales.permute(0, 3, 1, 2).reshape(-1, 512 // GROUP, 2)[:70]
    assert torch.equal(held[..., 0].float(), d) and torch.equal(held[..., 1].float(), m)
    assert layer.weight_bytes == 70 * (256 + 2 * 16 * 2) < 70 * 512 * 0.63
    gen = torch.Generator().manual_seed(12)
    for num_rows in (1, 5, 40):
        x = torch.randn(num_rows, 512, generator=gen).bfloat16()
        x_q, x_scales = kernels.int4_quantize_rows(x)
        assert torch.equal(layer(x, fp32_out=True), kernel_arithmetic(x_q, x_scales, nibbles, d, m)), num_rows


def test_q4_k_products_are_rounded_to_fp16(kernels):
    """Q4_K's d * sub-scale and dmin * sub-min, exact in fp32, are held rounded to fp16 (11 significant bits)."""
    rows = random_blocks("Q4_K", 20, 512, seed=13)
    nibbles, d, m = decode_four_bit(rows, "Q4_K", 512)
    layer = Int4Linear.from_nibbles(nibbles, d, m, torch.bfloat16, kernels)
    held = layer.scales.permute(0, 3, 1, 2).reshape(-1, 512 // GROUP, 2)[:20]
    assert torch.equal(held[..., 0], d.half()) and torch.equal(held[..., 1], m.half())
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(14)).bfloat16()
    x_q, x_scales = kernels.int4_quantize_rows(x)
    assert torch.equal(layer(x, fp32_out=True), kernel_arithmetic(x_q, x_scales, nibbles, d.half().float(),
                                                                   m.half().float()))


@pytest.mark.parametrize("tensor_type", ["Q4_0", "Q4_1", "Q4_K"])
def test_blocks_decode_as_the_gguf_package_dequantizes_them(tensor_type):
    import gguf
    rows = random_blocks(tensor_type, 7, 512, seed=1)
    nibbles, d, m = decode_four_bit(rows, tensor_type, 512)
    assert nibbles.dtype == torch.uint8 and int(nibbles.max()) <= 15 and d.shape == m.shape == (7, 16)
    expected = gguf.quants.dequantize(rows.numpy(), getattr(gguf.GGMLQuantizationType, tensor_type))
    ours = nibbles.double() * d.double().repeat_interleave(GROUP, 1) + m.double().repeat_interleave(GROUP, 1)
    torch.testing.assert_close(ours, torch.from_numpy(expected).double(), rtol=2 ** -22, atol=2 ** -30)


def test_a_row_of_the_wrong_size_is_named():
    with pytest.raises(ValueError, match="Q4_K rows of 96 values need 0 bytes .*multiple of 256"):
        decode_four_bit(torch.zeros(2, 54, dtype=torch.uint8), "Q4_K", 96)
    assert row_bytes("Q4_1", 64) == 40


@pytest.mark.parametrize("rows,k,n", SHAPES)
def test_int4_gemm_is_the_4_bit_product_of_quantized_x(kernels, rows, k, n):
    nibbles, d, m = random_int4(n, k, seed=rows * 1000 + k + n)
    bias = torch.randn(n) if rows % 2 else None
    layer = Int4Linear.from_nibbles(nibbles, d, m, torch.bfloat16, kernels)
    if bias is not None:
        layer.bias = bias
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).bfloat16()
    x_q, x_scales = kernels.int4_quantize_rows(x)
    expected = reference(x_q, x_scales, nibbles, d, m, bias)
    y = layer(x, fp32_out=True)
    assert y.dtype == torch.float32 and y.shape == (rows, n)
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    assert torch.equal(layer(x), y.bfloat16())  # bf16 out: the same sums, rounded once


def test_a_row_does_not_depend_on_its_batch(kernels):
    """The same row alone and among 3, 17, 31, 33, 64 rows (vector kernels below 32, AMX tiles from 32
    where the CPU has them, 33 with a tile of one row): the same bits."""
    nibbles, d, m = random_int4(200, 1536, seed=3)
    layer = Int4Linear.from_nibbles(nibbles, d, m, torch.bfloat16, kernels)
    gen = torch.Generator().manual_seed(4)
    row = torch.randn(1, 1536, generator=gen).bfloat16()
    alone = layer(row, fp32_out=True)
    for size in (1, 3, 17, 31, 33, 64):
        batch = torch.randn(size, 1536, generator=gen).bfloat16()
        batch[size // 2] = row[0]
        assert torch.equal(layer(batch, fp32_out=True)[size // 2], alone[0]), size


def test_dequantized_rows_are_the_weight(kernels):
    nibbles, d, m = random_int4(40, 160, seed=5)
    layer = Int4Linear.from_nibbles(nibbles, d, m, torch.bfloat16, kernels)
    ids = torch.tensor([[0, 17], [39, 5]])
    expected = nibbles.float() * d.repeat_interleave(GROUP, 1) + m.repeat_interleave(GROUP, 1)
    assert torch.equal(layer.dequantized_rows(ids), expected[ids])
    assert layer.rows(ids).dtype == torch.bfloat16
    assert layer.weight_bytes == 40 * (80 + 4 * 5) and layer.resident_bytes == 48 * 192 // 2 + 3 * 6 * 2 * 16 * 2


def test_rows_set_a_few_at_a_time_make_the_whole_weight():
    """A loader fills the layout a chunk of rows at a time, chunks across block edges (16 rows)."""
    nibbles, d, m = random_int4(70, 96, seed=7)
    whole = Int4Linear.from_nibbles(nibbles, d, m, torch.bfloat16, None)
    layer = Int4Linear.zeros(70, 96, torch.bfloat16, None)
    for start in range(0, 70, 11):
        layer.set_rows(start, nibbles[start:start + 11], d[start:start + 11], m[start:start + 11])
    assert torch.equal(layer.packed_weight, whole.packed_weight) and torch.equal(layer.scales, whole.scales)
    with pytest.raises(ValueError, match=r"rows 66\.\. of nibbles \(11, 96\)"):
        layer.set_rows(66, nibbles[:11], d[:11], m[:11])


def test_zero_rows_and_zero_x(kernels):
    nibbles, d, m = random_int4(16, 64, seed=6)
    layer = Int4Linear.from_nibbles(nibbles, d, m, torch.float32, kernels)
    assert layer(torch.zeros(0, 64)).shape == (0, 16)
    assert not layer(torch.zeros(2, 64)).any()  # x's scale 0: every term 0, m's too
