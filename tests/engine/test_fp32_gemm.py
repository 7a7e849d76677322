"""The kernels' fp32 GEMM (engine/kernels/csrc/gemm_fp32.cpp) and float32 layers packed for it: the
path of CPUs without bf16 dot products (AVX2 + FMA), weights held as fp32 or as bf16."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.kernels.cpu_linear import PackedEmbedding, PackedLinear, pack_linear

STORED = [torch.float32, torch.bfloat16]

# (rows, K, N): rows 1-40 around every tile edge (6 rows), K odd and even, N in whole and partial
# blocks and panels (16 and 48 columns), SmolLM2's own shapes, prompt chunks past the L2 chunk of x
SHAPES = [(m, 96, 208) for m in (*range(1, 14), 17, 18, 19, 23, 24, 25, 36, 40)] + [
    (1, 77, 200), (9, 77, 49), (3, 1, 16), (40, 1536, 96), (64, 576, 960), (5, 130, 17), (300, 33, 50),
    (2, 576, 3072), (513, 96, 200), (600, 1536, 50)]


def exact(x, weight, bias):
    y = x.double() @ weight.double().T
    return y if bias is None else y + bias.double()


def pack(kernels, weight, stored):
    return kernels.pack_weight(weight.to(stored))


@pytest.mark.parametrize("stored", STORED)
@pytest.mark.parametrize("rows,k,n", SHAPES)
def test_fp32_gemm_matches_the_exact_product(kernels, rows, k, n, stored):
    gen = torch.Generator().manual_seed(rows * 1000 + k + n)
    weight = torch.randn(n, k, generator=gen).to(stored).float()  # the values the packed copy holds
    bias = torch.randn(n, generator=gen) if (rows + n) % 2 else None
    x = torch.randn(rows, 2 * k + 3, generator=gen)[:, 3:k + 3]  # strided rows, odd offset
    got = kernels.gemm(x, pack(kernels, weight, stored), n, bias)
    assert got.dtype == torch.float32 and got.shape == (rows, n) and got.is_contiguous()
    torch.testing.assert_close(got.double(), exact(x, weight, bias), rtol=1e-5, atol=1e-5 * k ** 0.5)


# rows 1-300 past every tile height (6) and the bf16 panel's widening (from 13 rows), each panel down every row
PROMPT_ROWS = [1, 2, 5, 6, 7, 11, 12, 13, 17, 30, 47, 64, 97, 128, 199, 256, 300]


@pytest.mark.parametrize("stored", STORED)
@pytest.mark.parametrize("k,n", [(577, 1539), (1535, 577), (576, 1536)])
def test_fp32_gemm_agrees_with_torch_at_prompt_sizes(kernels, k, n, stored):
    gen = torch.Generator().manual_seed(k * 7 + n)
    weight = torch.randn(n, k, generator=gen).to(stored).float()
    bias = torch.randn(n, generator=gen)
    packed = pack(kernels, weight, stored)
    x = torch.randn(max(PROMPT_ROWS), k, generator=gen)
    for rows in PROMPT_ROWS:
        b = bias if rows % 2 else None
        torch.testing.assert_close(kernels.gemm(x[:rows], packed, n, b), F.linear(x[:rows], weight, b),
                                   rtol=1e-5, atol=1e-5 * k ** 0.5, msg=lambda m: f"{rows} rows: {m}")


@pytest.mark.parametrize("rows", [1, 8, 12, 13, 300])
@pytest.mark.parametrize("k,n", [(576, 960), (77, 200), (1536, 50)])
def test_bf16_stored_weights_give_the_bits_of_the_same_values_in_fp32(kernels, k, n, rows):
    """Widened in registers (a few rows) or into a panel first (many): the bits of fp32 storage."""
    gen = torch.Generator().manual_seed(k + n)
    weight = torch.randn(n, k, generator=gen).bfloat16()
    bias = torch.randn(n, generator=gen)
    x = torch.randn(rows, k, generator=gen)
    from_bf16 = kernels.gemm(x, kernels.pack_weight(weight), n, bias)
    assert torch.equal(from_bf16, kernels.gemm(x, kernels.pack_weight(weight.float()), n, bias))


@pytest.mark.parametrize("stored", STORED)
@pytest.mark.parametrize("k,n", [(576, 960), (1536, 240), (77, 200), (577, 1539)])
def test_a_row_keeps_its_bits_in_any_batch(kernels, k, n, stored):
    """Bit for bit: a row alone (a decode alone, the one new row of a cached prompt) and at every
    position of batches of 2 to 600 rows, strided or not, with and without bias."""
    gen = torch.Generator().manual_seed(k * n)
    packed = pack(kernels, torch.randn(n, k, generator=gen), stored)
    bias = torch.randn(n, generator=gen)
    wide = torch.randn(600, k + 40, generator=gen)
    x = wide[:, 8:8 + k].contiguous()
    for b in (None, bias):
        alone = torch.cat([kernels.gemm(x[i:i + 1], packed, n, b) for i in range(600)])
        for rows, start in [(2, 0), (5, 3), (6, 1), (7, 100), (8, 0), (13, 7), (64, 5), (129, 17), (299, 300), (600, 0)]:
            assert torch.equal(kernels.gemm(x[start:start + rows], packed, n, b), alone[start:start + rows]), \
                f"{rows} rows from row {start}"
            assert torch.equal(kernels.gemm(wide[start:start + rows, 8:8 + k], packed, n, b),
                               alone[start:start + rows]), f"{rows} strided rows from row {start}"


def test_fp32_gemm_from_several_threads_at_once(kernels):
    from concurrent.futures import ThreadPoolExecutor
    gen = torch.Generator().manual_seed(5)
    packed = kernels.pack_weight(torch.randn(3072, 576, generator=gen).bfloat16())
    inputs = [torch.randn(rows, 576, generator=gen) for rows in (1, 8, 64, 130) * 3]
    alone = [kernels.gemm(x, packed, 3072) for x in inputs]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda x: kernels.gemm(x, packed, 3072), inputs))
    assert all(torch.equal(a, b) for a, b in zip(alone, together))


def test_fp32_gemm_rejects_what_it_cannot_take(kernels):
    packed = kernels.pack_weight(torch.zeros(32, 8))
    assert packed.shape == (2, 8, 16)
    with pytest.raises(RuntimeError, match="packed"):
        kernels.gemm(torch.zeros(1, 9), packed, 32)
    with pytest.raises(RuntimeError, match="packed"):
        kernels.gemm(torch.zeros(1, 8), packed, 40)
    with pytest.raises(RuntimeError, match="packed"):
        kernels.gemm(torch.zeros(1, 40), kernels.pack_weight(torch.zeros(32, 8, dtype=torch.bfloat16)), 32)
    with pytest.raises(RuntimeError, match="bias"):
        kernels.gemm(torch.zeros(1, 8), packed, 32, torch.zeros(32, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="bf16 or float32"):
        kernels.gemm(torch.zeros(1, 8, dtype=torch.float16), packed, 32)
    with pytest.raises(RuntimeError, match="bf16 or float32"):
        kernels.pack_weight(torch.zeros(4, 4, dtype=torch.float16))
    assert kernels.gemm(torch.zeros(0, 8), packed, 32).shape == (0, 32)
    assert torch.equal(kernels.gemm(torch.zeros(2, 0), kernels.pack_weight(torch.zeros(32, 0)), 32, torch.ones(32)),
                       torch.ones(2, 32))


def test_the_fp32_inner_loop_peak_is_measured(kernels):
    assert kernels.gemm_fp32_isa() in ("avx2_fma", "portable")
    assert kernels.gemm_fp32_inner_loop_gflops(200, True) > 0
    assert kernels.gemm_fp32_inner_loop_gflops(200, False) > 0


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_a_float32_layer_packs_for_the_fp32_gemm(kernels, rows):
    gen = torch.Generator().manual_seed(rows)
    weight, bias = torch.randn(200, 96, generator=gen), torch.randn(200, generator=gen)
    packed = pack_linear(weight, bias)
    assert isinstance(packed, PackedLinear) and packed.stored_dtype == torch.float32
    assert packed.weight_bytes == (200 * 96 + 200) * 4
    x = torch.randn(rows, 96, generator=gen)
    torch.testing.assert_close(packed(x), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    assert packed(x.view(1, rows, 96)).shape == (1, rows, 200)


def test_bf16_values_are_held_as_bf16_and_other_values_only_when_asked(kernels):
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(49, 77, generator=gen)
    on_the_grid = weight.bfloat16().float()
    assert pack_linear(weight).stored_dtype == torch.float32  # rounding would lose bits: kept
    exact_copy = pack_linear(on_the_grid)
    assert exact_copy.stored_dtype == torch.bfloat16 and exact_copy.weight_bytes == 49 * 77 * 2
    asked = pack_linear(weight, stored_dtype=torch.bfloat16)
    assert asked.stored_dtype == torch.bfloat16
    x = torch.randn(5, 77, generator=gen)
    assert torch.equal(asked(x), exact_copy(x))  # the rounded weight, multiplied in fp32
    ids = torch.tensor([[0, 48], [17, 16]])
    assert torch.equal(pack_linear(weight).rows(ids), weight[ids])
    assert torch.equal(asked.rows(ids), on_the_grid[ids]) and asked.rows(ids).dtype == torch.float32
    assert torch.equal(PackedEmbedding(asked)(ids[0]), on_the_grid[ids[0]])
