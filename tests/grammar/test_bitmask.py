"""grammar.bitmask against a plain reference: unpack every bit, masked_fill."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from grammar.bitmask import apply_bitmask, masked_argmax


def reference_mask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool [rows, vocab_size]: True where the token is allowed."""
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")
    return torch.from_numpy(bits[:, :vocab_size].astype(bool))


def make_bitmask(num_rows: int, num_words: int, seed: int) -> torch.Tensor:
    """Rows of every shape the engine meets: sparse, dense, random, nothing, everything."""
    rng = np.random.default_rng(seed)
    bits = np.zeros((num_rows, num_words * 32), dtype=np.uint8)
    for row in range(num_rows):
        shape = row % 5
        if shape == 0:  # sparse: a handful allowed
            bits[row, rng.choice(num_words * 32, size=rng.integers(1, 6), replace=False)] = 1
        elif shape == 1:  # dense: a handful forbidden
            bits[row] = 1
            bits[row, rng.choice(num_words * 32, size=rng.integers(1, 40), replace=False)] = 0
        elif shape == 2:
            bits[row] = rng.random(num_words * 32) < 0.5
        elif shape == 3:
            bits[row] = 1
        # shape 4: nothing allowed
    packed = np.packbits(bits, axis=1, bitorder="little").view(np.int32)
    return torch.from_numpy(packed.copy())


# vocab 1000 is not a multiple of 32, and the bitmask is wider than needed: both kinds of
# padding columns must be ignored
@pytest.mark.parametrize("vocab_size, num_words", [(1000, 32), (1000, 40), (49152, 1536)])
@pytest.mark.parametrize("seed", [0, 1])
def test_apply_bitmask_matches_masked_fill(vocab_size, num_words, seed):
    bitmask = make_bitmask(10, num_words, seed)
    logits = torch.randn(10, vocab_size, generator=torch.Generator().manual_seed(seed))
    expected = logits.masked_fill(~reference_mask(bitmask, vocab_size), float("-inf"))
    apply_bitmask(logits, bitmask)
    assert torch.equal(logits, expected)


def test_only_the_listed_rows_are_touched_in_the_given_order():
    vocab_size = 1000
    bitmask = make_bitmask(4, 32, seed=3)
    logits = torch.randn(7, vocab_size)
    rows = [5, 0, 3, 6]  # bitmask row k constrains logits row rows[k]
    expected = logits.clone()
    mask = reference_mask(bitmask, vocab_size)
    for k, row in enumerate(rows):
        expected[row] = expected[row].masked_fill(~mask[k], float("-inf"))
    apply_bitmask(logits, bitmask, rows)
    assert torch.equal(logits, expected)
    assert torch.equal(logits[[1, 2, 4]], expected[[1, 2, 4]])


def test_non_contiguous_and_bfloat16_logits_are_written_back():
    bitmask = make_bitmask(5, 32, seed=4)
    base = torch.randn(1000, 5).t()  # a transposed view: not contiguous
    expected = base.masked_fill(~reference_mask(bitmask, 1000), float("-inf"))
    apply_bitmask(base, bitmask)
    assert torch.equal(base, expected)
    half = torch.randn(5, 1000).bfloat16()
    expected = half.masked_fill(~reference_mask(bitmask, 1000), float("-inf"))
    apply_bitmask(half, bitmask)
    assert torch.equal(half, expected)


@pytest.mark.parametrize("vocab_size, num_words", [(1000, 32), (49152, 1536)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_masked_argmax_equals_argmax_of_masked_logits(vocab_size, num_words, seed):
    bitmask = make_bitmask(12, num_words, seed)
    bitmask = bitmask[[i for i in range(12) if i % 5 != 4]]  # rows that allow nothing: tested below
    logits = torch.randn(len(bitmask) + 2, vocab_size, generator=torch.Generator().manual_seed(seed))
    rows = list(range(2, len(bitmask) + 2))
    before = logits.clone()
    masked = logits[rows].masked_fill(~reference_mask(bitmask, vocab_size), float("-inf"))
    assert torch.equal(masked_argmax(logits, bitmask, rows), masked.argmax(dim=1))
    assert torch.equal(logits, before)  # untouched


def test_masked_argmax_when_the_best_token_is_forbidden_in_a_dense_row():
    bitmask = torch.full((1, 32), -1, dtype=torch.int32)
    logits = torch.zeros(1, 1000)
    logits[0, 700] = 5.0
    logits[0, 3] = 4.0
    bitmask[0, 700 // 32] &= ~(1 << (700 % 32))
    assert masked_argmax(logits, bitmask).tolist() == [3]


def test_masked_argmax_ties_go_to_the_lowest_allowed_id():
    bitmask = torch.zeros(2, 32, dtype=torch.int32)
    bitmask[0, 1] = 0b1010  # ids 33 and 35
    bitmask[1] = -1
    logits = torch.zeros(2, 1000)
    assert masked_argmax(logits, bitmask).tolist() == [33, 0]


def test_a_row_that_allows_nothing_falls_back_to_the_unmasked_argmax():
    bitmask = torch.zeros(1, 32, dtype=torch.int32)
    logits = torch.randn(1, 1000)
    assert masked_argmax(logits, bitmask).tolist() == logits.argmax(dim=1).tolist()


def test_a_bitmask_too_narrow_for_the_logits_is_refused():
    with pytest.raises(ValueError, match="covers 992 tokens"):
        apply_bitmask(torch.zeros(1, 1000), torch.zeros(1, 31, dtype=torch.int32))
    with pytest.raises(ValueError, match="row_indices"):
        apply_bitmask(torch.zeros(3, 1000), torch.zeros(2, 32, dtype=torch.int32))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("with_xgrammar_kernel", [True, False])
def test_cuda_logits_match_the_cpu_result(with_xgrammar_kernel):
    from grammar import bitmask as bitmask_ops

    from grammar.xgrammar.matcher import apply_bitmask_xgrammar  # registers xgrammar's CUDA kernel
    xgrammar_kernel = apply_bitmask_xgrammar
    calls = []

    def counting_kernel(*args):
        calls.append(1)
        xgrammar_kernel(*args)

    saved = bitmask_ops._device_kernels.pop("cuda", None)
    assert saved is xgrammar_kernel
    if with_xgrammar_kernel:
        bitmask_ops.register_device_kernel("cuda", counting_kernel)
    try:
        vocab_size = 49152 + 40
        bitmask = make_bitmask(10, (vocab_size + 31) // 32, seed=5)
        cpu = torch.randn(12, vocab_size)
        rows = [11, 0, 2, 3, 4, 5, 6, 7, 8, 1]
        gpu = cpu.cuda()
        apply_bitmask(cpu, bitmask, rows)
        apply_bitmask(gpu, bitmask, rows)
        assert torch.equal(gpu.cpu(), cpu)
        fresh = torch.randn(12, vocab_size)
        keep = [i for i in range(10) if i % 5 != 4]
        expected = masked_argmax(fresh, bitmask[keep], [rows[i] for i in keep])
        assert torch.equal(masked_argmax(fresh.cuda(), bitmask[keep], [rows[i] for i in keep]).cpu(), expected)
        assert bool(calls) == with_xgrammar_kernel  # xgrammar's kernel ran, or the torch fallback did
    finally:
        bitmask_ops.register_device_kernel("cuda", saved)
