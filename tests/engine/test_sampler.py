"""Sampler: greedy, masks, dead ends, seeds, top-k/p, min-p, penalties, logprobs."""
from __future__ import annotations

import numpy as np
import torch

from engine.worker.sampler import Sampler, SamplingMetadata

VOCAB = 64


def meta(n, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seeds=None, penalties=None, logprobs=None):
    return SamplingMetadata(
        temperature=np.full(n, temperature, dtype=np.float32), top_k=np.full(n, top_k),
        top_p=np.full(n, top_p, dtype=np.float32), min_p=np.full(n, min_p, dtype=np.float32),
        generators=[torch.Generator().manual_seed(s) for s in seeds] if seeds else [None] * n,
        penalties=penalties or {}, num_logprobs=logprobs or [None] * n)


def bitmask_allowing(*ids_per_row):
    mask = torch.zeros(len(ids_per_row), VOCAB // 32, dtype=torch.int32)
    for row, ids in enumerate(ids_per_row):
        for i in ids:
            mask[row, i // 32] |= torch.tensor(1 << (i % 32), dtype=torch.int64).to(torch.int32)
    return mask


def test_greedy_with_mask_and_dead_end():
    logits = torch.randn(3, VOCAB)
    bitmask = bitmask_allowing([5, 40], [])
    out = Sampler()(logits.clone(), meta(3), bitmask, np.array([0, -1, 1]))
    expected0 = 5 if logits[0, 5] > logits[0, 40] else 40
    assert out.token_ids[0] == expected0
    assert out.token_ids[1] == logits[1].argmax()
    assert out.dead_end_rows.tolist() == [2]


def test_sampling_respects_the_mask():
    bitmask = bitmask_allowing([3, 33, 63])
    for seed in range(20):
        out = Sampler()(torch.randn(1, VOCAB), meta(1, temperature=1.5, seeds=[seed]), bitmask, np.array([0]))
        assert out.token_ids[0] in (3, 33, 63)


def test_seeded_rows_are_reproducible_whatever_the_batch():
    logits = torch.randn(1, VOCAB)
    alone = [Sampler()(logits.clone(), meta(1, temperature=1.0, seeds=[7])).token_ids[0]]
    batched = Sampler()(torch.cat([torch.randn(2, VOCAB), logits]), meta(3, temperature=1.0, seeds=[1, 2, 7]))
    assert batched.token_ids[2] == alone[0]


def test_top_k_1_and_tiny_top_p_are_greedy():
    logits = torch.randn(4, VOCAB)
    for m in (meta(4, temperature=1.0, top_k=1, seeds=[0, 1, 2, 3]),
              meta(4, temperature=1.0, top_p=1e-6, seeds=[0, 1, 2, 3]),
              meta(4, temperature=1.0, min_p=0.999, seeds=[0, 1, 2, 3])):
        assert Sampler()(logits.clone(), m).token_ids.tolist() == logits.argmax(-1).tolist()


def test_penalties_discourage_repeats():
    logits = torch.zeros(1, VOCAB)
    logits[0, 10] = 1.0
    logits[0, 11] = 0.9
    history = np.array([10, 10], dtype=np.int64)
    out = Sampler()(logits.clone(), meta(1, penalties={0: (history, history, 1.0, 0.5, 0.0)}))
    assert out.token_ids[0] == 11
    out = Sampler()(logits.clone(), meta(1, penalties={0: (history, history, 2.0, 0.0, 0.0)}))
    assert out.token_ids[0] == 11


def test_logprobs_come_from_raw_logits():
    logits = torch.randn(1, VOCAB)
    bitmask = bitmask_allowing([9])
    out = Sampler()(logits.clone(), meta(1, logprobs=[2]), bitmask, np.array([0]))
    raw = torch.log_softmax(logits, -1)[0]
    lp = out.logprobs[0]
    assert lp.token_id == 9 and abs(lp.logprob - raw[9].item()) < 1e-5
    assert [t for t, _ in lp.top] == raw.topk(2).indices.tolist()


def test_nan_logits_never_break_the_grammar():
    logits = torch.full((2, VOCAB), float("nan"))
    logits[1] = torch.randn(VOCAB)
    bitmask = bitmask_allowing([7, 9], [11])
    for seed in range(5):
        out = Sampler()(logits.clone(), meta(2, temperature=1.0, seeds=[seed, seed]), bitmask, np.array([0, 1]))
        assert out.token_ids[0] in (7, 9) and out.token_ids[1] == 11


def test_a_tiny_temperature_is_greedy():
    logits = torch.randn(1, VOCAB)
    out = Sampler()(logits.clone(), meta(1, temperature=1e-30, seeds=[1]))
    assert out.token_ids[0] == logits[0].argmax()


def test_min_tokens_bans_the_ending_ids_unless_the_grammar_allows_only_them():
    logits = torch.zeros(3, VOCAB)
    logits[:, 2] = 10.0  # the ending id is every row's favourite
    m = meta(3)
    m.banned_token_ids = {0: np.array([2]), 1: np.array([2]), 2: np.array([2])}
    bitmask = bitmask_allowing([2, 7], [2])  # row 1: more than the ending id; row 2: only it
    out = Sampler()(logits.clone(), m, bitmask, np.array([-1, 0, 1]))
    assert out.token_ids[0] != 2  # unconstrained: anything but the ending id
    assert out.token_ids[1] == 7  # the grammar's other id
    assert out.token_ids[2] == 2  # the grammar allows only the ending id: it wins
    assert out.dead_end_rows.tolist() == []


def test_min_tokens_bans_apply_to_sampled_rows():
    logits = torch.zeros(1, VOCAB)
    logits[0, 5] = 50.0
    for seed in range(5):
        m = meta(1, temperature=1.0, seeds=[seed])
        m.banned_token_ids = {0: np.array([5])}
        assert Sampler()(logits.clone(), m).token_ids[0] != 5
