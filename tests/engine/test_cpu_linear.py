"""bf16 linear layers packed once (engine/kernels/cpu_linear.py) and the kernels' GEMM under them."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels import cpu_linear
from engine.kernels.cpu_linear import PackedEmbedding, PackedLinear, can_pack, pack_linear, pack_linears
from engine.kernels.loader import load_cpu_kernels

needs_packing = pytest.mark.skipif(not can_pack(torch.zeros(1, dtype=torch.bfloat16)),
                                   reason="torch here has no oneDNN weight packing")


@needs_packing
@pytest.mark.parametrize("out_features", [208, 200])  # whole and partial blocks of 16 columns
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 16, 17, 64, 300])
def test_packed_layer_computes_what_f_linear_does(rows, bias, out_features):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(out_features, 96, generator=gen).bfloat16()
    b = torch.randn(out_features, generator=gen).bfloat16() if bias else None
    packed = pack_linear(weight, b)
    assert isinstance(packed, PackedLinear)
    assert packed.shares_rows == (load_cpu_kernels() is not None)
    x = torch.randn(rows, 96, generator=gen).bfloat16()
    got, expected = packed(x), F.linear(x, weight, b)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, out_features)
    torch.testing.assert_close(got.float(), expected.float(), rtol=2 ** -7, atol=1e-3)  # one bf16 rounding
    strided = torch.randn(rows, 2 * 96, generator=gen).bfloat16()[:, :96]  # a column slice, as views arrive
    torch.testing.assert_close(packed(strided).float(), F.linear(strided, weight, b).float(), rtol=2 ** -7, atol=1e-3)
    batched = x.view(1, rows, 96)
    assert packed(batched).shape == (1, rows, out_features)


def fp32_reference(x, weight, bias):
    """The exact product in float64, for a kernel whose only rounding is its bf16 output."""
    y = x.double() @ weight.double().T
    return y if bias is None else y + bias.double()


# (rows, K, N): rows 1-256 around every tile edge (8 rows), K odd and not a multiple of anything,
# N in whole and partial blocks and panels (16 and 48 columns), SmolLM2's own shapes
GEMM_SHAPES = [(m, 96, 208) for m in (*range(1, 18), 23, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 255, 256)] + [
    (1, 77, 200), (9, 77, 49), (3, 1, 16), (40, 1536, 96), (64, 576, 960), (5, 130, 17), (300, 33, 50), (2, 576, 3072),
    # prompt chunks: several row ranges (x read in place where K is whole tiles), panels cut short
    (512, 576, 208), (513, 96, 200), (600, 1536, 50), (599, 77, 130), (456, 64, 17)]


@pytest.mark.parametrize("rows,k,n", GEMM_SHAPES)
def test_gemm_matches_the_exact_product(kernels, rows, k, n):
    gen = torch.Generator().manual_seed(rows * 1000 + k + n)
    weight = torch.randn(n, k, generator=gen).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16() if (rows + n) % 2 else None
    x = torch.randn(rows, 2 * k + 3, generator=gen).bfloat16()[:, 3:k + 3]  # strided rows, odd offset
    packed = kernels.pack_weight(weight)
    assert packed.shape == (-(-n // 16), -(-k // 32) * 16, 16, 2)  # K padded to whole AMX tiles
    got = kernels.gemm(x, packed, n, bias)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n) and got.is_contiguous()
    expected = fp32_reference(x, weight, bias)
    # the output's own bf16 rounding (2^-9 relative), plus fp32 sums in another order
    torch.testing.assert_close(got.double(), expected, rtol=2 ** -8, atol=1e-4 * k ** 0.5)


@pytest.mark.parametrize("rows,k,n", [(1, 576, 960), (7, 77, 200), (64, 576, 3072), (129, 96, 208), (3, 1, 16)])
def test_gemm_hands_back_its_fp32_sums(kernels, rows, k, n):
    """fp32_out: the same sums unrounded (the logits' head), so rounding them is the bf16 result bit
    for bit, and they are as close to the exact product as fp32 sums are; rows stay independent."""
    gen = torch.Generator().manual_seed(rows + k + n)
    weight = torch.randn(n, k, generator=gen).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16() if rows % 2 else None
    x = torch.randn(rows, 2 * k, generator=gen).bfloat16()[:, :k]
    packed = kernels.pack_weight(weight)
    got = kernels.gemm(x, packed, n, bias, fp32_out=True)
    assert got.dtype == torch.float32 and got.shape == (rows, n) and got.is_contiguous()
    assert torch.equal(got.bfloat16(), kernels.gemm(x, packed, n, bias))
    torch.testing.assert_close(got.double(), fp32_reference(x, weight, bias), rtol=1e-5, atol=1e-5 * k ** 0.5)
    alone = torch.cat([kernels.gemm(x[i:i + 1], packed, n, bias, fp32_out=True) for i in range(rows)])
    assert torch.equal(alone, got)


def test_gemm_from_several_threads_at_once(kernels):
    """Callers share the kernels' worker threads (one runs alone while another's job is on): every
    product still comes out whole and right, and a row's result does not depend on the other rows."""
    from concurrent.futures import ThreadPoolExecutor
    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(3072, 576, generator=gen).bfloat16()
    packed = kernels.pack_weight(weight)
    inputs = [torch.randn(rows, 576, generator=gen).bfloat16() for rows in (1, 8, 64, 130) * 3]
    alone = [kernels.gemm(x, packed, 3072) for x in inputs]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda x: kernels.gemm(x, packed, 3072), inputs))
    assert all(torch.equal(a, b) for a, b in zip(alone, together))
    others = inputs[2].clone()
    others[1:] = torch.randn(63, 576, generator=gen).bfloat16()
    assert torch.equal(kernels.gemm(others, packed, 3072)[0], alone[2][0])  # a row does not depend on the others


@pytest.mark.parametrize("k,n", [(576, 960), (1536, 576), (77, 200)])
def test_a_row_does_not_depend_on_the_rows_beside_it(kernels, k, n):
    """Bit for bit: each row's product alone (one row: a decode alone, the one new row of a prompt
    answered from the prefix cache) and at every position of batches of 2 to 300 rows (decode
    batches, prompts, chunks), with and without bias."""
    gen = torch.Generator().manual_seed(k + n)
    weight = torch.randn(n, k, generator=gen).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16()
    packed = kernels.pack_weight(weight)
    x = torch.randn(300, k, generator=gen).bfloat16()
    for b in (None, bias):
        alone = torch.cat([kernels.gemm(x[i:i + 1], packed, n, b) for i in range(300)])
        for rows in (2, 7, 8, 9, 16, 17, 33, 64, 129, 300):
            for start in {0, 300 - rows, (300 - rows) // 3}:
                together = kernels.gemm(x[start:start + rows], packed, n, b)
                assert torch.equal(together, alone[start:start + rows]), f"{rows} rows from row {start}"


@pytest.mark.parametrize("k,n", [(576, 960), (1536, 240), (96, 200)])
def test_a_row_keeps_its_bits_in_prompt_sized_batches(kernels, k, n):
    """Bit for bit, a row alone and in batches of up to 600 rows at any offset (rows split into
    ranges and read in place, 16 at a time, or from the padded copy of a last partial tile), its
    x rows contiguous or strided: the sums over K run in one order whatever the batch."""
    gen = torch.Generator().manual_seed(k * n)
    weight = torch.randn(n, k, generator=gen).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16()
    packed = kernels.pack_weight(weight)
    wide = torch.randn(700, k + 40, generator=gen).bfloat16()
    x = wide[:, 8:8 + k].contiguous()
    alone = torch.cat([kernels.gemm(x[i:i + 1], packed, n, bias) for i in range(700)])
    for rows, start in [(64, 0), (64, 5), (128, 17), (200, 3), (512, 0), (512, 100), (513, 1), (600, 99), (700, 0)]:
        assert torch.equal(kernels.gemm(x[start:start + rows], packed, n, bias), alone[start:start + rows]), \
            f"{rows} rows from row {start}"
        strided = wide[start:start + rows, 8:8 + k]
        assert strided.stride(0) == k + 40
        assert torch.equal(kernels.gemm(strided, packed, n, bias), alone[start:start + rows]), \
            f"{rows} strided rows from row {start}"
    fp32 = kernels.gemm(x[:600], packed, n, bias, fp32_out=True)
    assert torch.equal(fp32, torch.cat([kernels.gemm(x[i:i + 1], packed, n, bias, fp32_out=True) for i in range(600)]))


def test_gemm_rejects_what_it_cannot_take(kernels):
    packed = kernels.pack_weight(torch.zeros(32, 8, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="packed"):
        kernels.gemm(torch.zeros(1, 40, dtype=torch.bfloat16), packed, 32)  # K known up to its padding to 32
    with pytest.raises(RuntimeError, match="packed"):
        kernels.gemm(torch.zeros(1, 8, dtype=torch.bfloat16), packed, 40)
    with pytest.raises(RuntimeError, match="bf16"):
        kernels.gemm(torch.zeros(1, 8, dtype=torch.float16), packed, 32)
    with pytest.raises(RuntimeError, match="contiguous rows"):
        kernels.gemm(torch.zeros(8, 2, dtype=torch.bfloat16).T, packed, 32)
    with pytest.raises(RuntimeError, match="bias"):
        kernels.gemm(torch.zeros(1, 8, dtype=torch.bfloat16), packed, 32, torch.zeros(31, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="2-D bf16"):
        kernels.pack_weight(torch.zeros(4, 4, dtype=torch.float16))
    assert kernels.gemm(torch.zeros(0, 8, dtype=torch.bfloat16), packed, 32).shape == (0, 32)


def test_the_build_has_the_isa_asked_for(kernels):
    """FORMWORK_CPU_ISA=avx2 builds the portable kernels; natively, AMX or AVX-512 BF16 where the CPU has them."""
    from engine.config import cpu_flags
    if os.environ.get("FORMWORK_CPU_ISA") == "avx2":
        assert kernels.gemm_isa() == "portable"
    elif "amx_bf16" in cpu_flags():
        assert kernels.gemm_isa() == "amx_bf16"
    elif "avx512_bf16" in cpu_flags():
        assert kernels.gemm_isa() == "avx512_bf16"
    assert kernels.gemm_inner_loop_gflops(200) > 0


@pytest.mark.parametrize("n,k", [(208, 96), (49, 77), (16, 1)])
def test_rows_read_the_plain_weight_back_from_the_packed_copy(kernels, n, k):
    weight = torch.randn(n, k, generator=torch.Generator().manual_seed(n)).bfloat16()
    packed = pack_linear(weight)
    assert packed.shares_rows
    ids = torch.tensor([[0, n - 1], [n // 2, 15 % n]])
    assert torch.equal(packed.rows(ids), weight[ids])
    assert torch.equal(PackedEmbedding(packed)(ids[0]), weight[ids[0]])
    assert packed.resident_bytes == -(-n // 16) * 16 * -(-k // 32) * 32 * 2  # the padded copy, nothing more


def test_float16_stays_plain_and_float32_packs_only_for_the_kernels(monkeypatch):
    assert pack_linear(torch.randn(8, 8, dtype=torch.float16)) is None
    monkeypatch.setattr(cpu_linear, "load_cpu_kernels", lambda: None)  # oneDNN's packing is bf16 only
    assert pack_linear(torch.randn(8, 8)) is None


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
    monkeypatch.setattr(cpu_linear, "_CHECKED_SHAPES", set())  # a shape checked before is not checked again
    monkeypatch.setattr(PackedLinear, "forward", lambda self, x: torch.zeros(x.shape[0], self.out_features) + 1)
    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16)).bfloat16()
    assert pack_linears(model) == 0
    assert all(isinstance(m, nn.Linear) for m in model)
    assert "plain bf16 matmuls" in caplog.text
    monkeypatch.setattr(cpu_linear, "load_cpu_kernels", lambda: None)  # no kernels, no oneDNN: nothing packs
    monkeypatch.setattr(cpu_linear.torch.backends.mkldnn, "is_available", lambda: False)
    assert pack_linear(torch.zeros(4, 4, dtype=torch.bfloat16)) is None


@needs_packing
def test_each_shape_is_checked_against_f_linear_once(monkeypatch):
    monkeypatch.setattr(cpu_linear, "_CHECKED_SHAPES", set())
    calls, linear = [], F.linear
    monkeypatch.setattr(F, "linear", lambda *args: calls.append(1) or linear(*args))
    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 16), nn.Linear(16, 32)).bfloat16()
    assert pack_linears(model) == 3
    assert len(calls) == 2 * 2  # two probes for each of the two shapes


@pytest.mark.slow
def test_the_served_model_reads_every_weight_once(llm, model_dir):
    """On CPU the decoder's matmuls are packed and the roofline still counts each weight once (the
    matmul weights in the dtype they are held in: bf16 for a float32 model of dtype auto)."""
    from bench.roofline import weight_bytes
    model = llm.engine.runner.model
    dtype = next(model.parameters()).dtype
    packs = can_pack(next(model.parameters()))
    assert isinstance(model.layers[0].qkv_proj, PackedLinear) == packs
    assert (model.packed_lm_head is not None) == packs
    held = model.layers[0].qkv_proj.stored_dtype if packs else dtype
    assert held == getattr(torch, llm.engine.config.cpu_weight_torch_dtype or str(dtype).removeprefix("torch."))
    if held == dtype:
        assert model.weight_bytes() == weight_bytes(model_dir, str(dtype).removeprefix("torch."))
    else:  # the norms stay float32: a few KiB over the bf16 count
        assert 0 < model.weight_bytes() - weight_bytes(model_dir, "bfloat16") < 2 ** 20
    if packs and model.packed_lm_head.shares_rows:  # the tied embedding reads the head's packed copy
        assert model.resident_weight_bytes() == model.weight_bytes()  # each weight held once: 1.0x
