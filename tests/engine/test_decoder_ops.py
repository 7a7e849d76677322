"""The fused decoder steps: the CPU kernels against the torch path they replace, and both against
the formulas written out here in float64 (so a mistake shared by the two paths still shows)."""
from __future__ import annotations

import pytest
import torch

from engine.kernels import decoder_ops


def both_paths(fn, *tensors):
    """fn on clones of the inputs through the kernels, then through torch."""
    first = [t.clone() for t in tensors]
    second = [t.clone() for t in tensors]
    out_kernel = fn(*first)
    original = decoder_ops._kernels_for
    decoder_ops._kernels_for = lambda t: None
    try:
        out_torch = fn(*second)
    finally:
        decoder_ops._kernels_for = original
    return (out_kernel, first), (out_torch, second)


def rms_norm_by_hand(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * weight.double()


def silu_and_mul_by_hand(gate_up: torch.Tensor) -> torch.Tensor:
    half = gate_up.shape[-1] // 2
    gate, up = gate_up[:, :half].double(), gate_up[:, half:].double()
    return gate / (1 + torch.exp(-gate)) * up


def rotary_by_hand(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_rotated: int,
                   head_dim: int) -> torch.Tensor:
    """Element i of the first half pairs with element i + half: (a, b) -> (a cos - b sin, b cos + a sin)."""
    out = qkv.double().clone()
    half = head_dim // 2
    c, s = cos.double(), sin.double()
    for head in range(num_rotated):
        a = qkv[:, head * head_dim:head * head_dim + half].double()
        b = qkv[:, head * head_dim + half:(head + 1) * head_dim].double()
        out[:, head * head_dim:head * head_dim + half] = a * c[:, :half] - b * s[:, :half]
        out[:, head * head_dim + half:(head + 1) * head_dim] = b * c[:, half:] + a * s[:, half:]
    return out


TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
ROWS = [1, 7, 300]  # a single decode, a small batch, a prompt chunk (split across threads)


@pytest.mark.parametrize("dtype", TOL)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("with_delta", [False, True])
def test_add_rms_norm(kernels, dtype, rows, with_delta):
    gen = torch.Generator().manual_seed(rows)
    residual = (torch.randn(rows, 576, generator=gen) * 4).to(dtype)
    delta = torch.randn(rows, 576, generator=gen).to(dtype)
    weight = torch.rand(576, generator=gen).to(dtype) + 0.5
    (ours, (res_k, _)), (ref, (res_t, _)) = both_paths(
        lambda r, d: decoder_ops.add_rms_norm(r, d if with_delta else None, weight, 1e-5), residual, delta)
    torch.testing.assert_close(ours, ref, **TOL[dtype])
    torch.testing.assert_close(res_k, res_t, **TOL[dtype])  # the residual was updated in place (or left)
    summed = residual.double() + delta.double() if with_delta else residual.double()
    torch.testing.assert_close(res_k.double(), summed, **TOL[dtype])
    torch.testing.assert_close(ours.double(), rms_norm_by_hand(summed, weight, 1e-5), **TOL[dtype])
    if not with_delta:
        assert torch.equal(res_k, residual)


@pytest.mark.parametrize("hidden", [576, 100])  # rows 64-byte aligned, and rows at every alignment
def test_a_row_norm_does_not_depend_on_the_rows_beside_it(kernels, hidden):
    """Bit for bit: a row normalized alone (a decode alone) and as one row of a prompt split across threads."""
    gen = torch.Generator().manual_seed(hidden)
    residual = torch.randn(300, hidden, generator=gen).bfloat16()
    delta = torch.randn(300, hidden, generator=gen).bfloat16()
    weight = torch.randn(hidden, generator=gen).bfloat16()
    together = kernels.add_rms_norm(residual.clone(), delta, weight, 1e-5)
    for i in (0, 1, 7, 150, 299):
        alone = kernels.add_rms_norm(residual[i:i + 1].clone(), delta[i:i + 1].clone(), weight, 1e-5)
        assert torch.equal(alone[0], together[i]), f"row {i}"


@pytest.mark.parametrize("dtype", TOL)
@pytest.mark.parametrize("rows", ROWS)
def test_silu_and_mul(kernels, dtype, rows):
    gate_up = (torch.randn(rows, 2 * 1536, generator=torch.Generator().manual_seed(rows)) * 3).to(dtype)
    (ours, _), (ref, _) = both_paths(decoder_ops.silu_and_mul, gate_up)
    assert ours.shape == (rows, 1536)
    torch.testing.assert_close(ours, ref, **TOL[dtype])
    torch.testing.assert_close(ours.double(), silu_and_mul_by_hand(gate_up), **TOL[dtype])


@pytest.mark.parametrize("dtype", TOL)
@pytest.mark.parametrize("rows", ROWS)
def test_rotary_rotates_q_and_k_heads_only(kernels, dtype, rows):
    gen = torch.Generator().manual_seed(rows)
    qkv = torch.randn(rows, 15 * 64, generator=gen).to(dtype)  # 9 q heads, 3 k heads, 3 v heads
    angles = torch.rand(rows, 32, generator=gen) * 100
    cos = torch.cat((angles.cos(), angles.cos()), dim=-1).to(dtype)
    sin = torch.cat((angles.sin(), angles.sin()), dim=-1).to(dtype)
    (_, (ours,)), (_, (ref,)) = both_paths(lambda x: decoder_ops.rotary_(x, cos, sin, 12, 64), qkv)
    torch.testing.assert_close(ours, ref, **TOL[dtype])
    torch.testing.assert_close(ours.double(), rotary_by_hand(qkv, cos, sin, 12, 64), **TOL[dtype])
    assert torch.equal(ours[:, 12 * 64:], qkv[:, 12 * 64:])  # values untouched
    assert not torch.equal(ours[:, :64], qkv[:, :64])


def test_kernels_reject_bad_shapes(kernels):
    with pytest.raises(RuntimeError, match="weight"):
        kernels.add_rms_norm(torch.zeros(2, 8), None, torch.ones(7), 1e-5)
    with pytest.raises(RuntimeError, match="even"):
        kernels.silu_and_mul(torch.zeros(2, 7))
    with pytest.raises(RuntimeError, match="rotary"):
        kernels.rotary_(torch.zeros(2, 64), torch.zeros(2, 64), torch.zeros(2, 64), 2, 64)
    with pytest.raises(ValueError, match="int5: expected float, int8 or int4"):
        kernels.Projection("int5", torch.zeros(1, dtype=torch.uint8), torch.zeros(1), None)
    with pytest.raises(ValueError, match="int8 needs its scales"):
        kernels.Projection("int8", torch.zeros(1, dtype=torch.uint8), None, None)
