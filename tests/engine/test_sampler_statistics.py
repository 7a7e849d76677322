"""The sampler draws from the distribution its parameters define, row by row.

Each check draws a few thousand tokens (seeded: the same draws every run) from a vocabulary of 8
and compares the counts with the probabilities computed here independently, in numpy, with a
chi-square statistic. The bound is loose (a tail probability of about 1e-7 for a correct sampler)
while any wrong distribution below is off by hundreds.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from engine.worker.sampler import Sampler, SamplingMetadata

VOCAB = 8
NUM_DRAWS = 4000
LOGITS = np.array([2.0, 1.5, 1.0, 0.6, 0.2, -0.3, -0.8, -1.5], dtype=np.float32)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x[np.isfinite(x)].max())
    e[~np.isfinite(x)] = 0.0
    return e / e.sum()


def keep_top_k(p: np.ndarray, k: int) -> np.ndarray:
    out = np.where(p >= np.sort(p)[-k], p, 0.0)
    return out / out.sum()


def keep_top_p(p: np.ndarray, top_p: float) -> np.ndarray:
    order = np.argsort(-p)
    before = np.concatenate([[0.0], np.cumsum(p[order])[:-1]])  # mass of the tokens ranked above
    out = np.zeros_like(p)
    out[order[before < top_p]] = p[order[before < top_p]]
    return out / out.sum()


def keep_min_p(p: np.ndarray, min_p: float) -> np.ndarray:
    out = np.where(p >= min_p * p.max(), p, 0.0)
    return out / out.sum()


def chi_square_bound(df: int, z: float = 5.0) -> float:
    """Upper chi-square quantile (Wilson-Hilferty), z standard deviations out: about 3e-7 for z = 5."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi_square(counts: np.ndarray, expected_p: np.ndarray) -> float:
    """Chi-square of the counts against the probabilities; a token of probability 0 must never appear."""
    assert counts[expected_p == 0].sum() == 0, f"drew tokens of probability 0: {counts} vs {expected_p}"
    live = expected_p > 0
    expected = counts.sum() * expected_p[live]
    return float(((counts[live] - expected) ** 2 / expected).sum())


def assert_distribution(counts: np.ndarray, expected_p: np.ndarray) -> None:
    df = max(int((expected_p > 0).sum()) - 1, 1)
    stat = chi_square(counts, expected_p)
    assert stat < chi_square_bound(df), f"chi-square {stat:.1f} (df {df}): counts {counts.tolist()}, " \
                                        f"expected {np.round(counts.sum() * expected_p).tolist()}"


def make_meta(num_rows: int, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, penalties=None) -> SamplingMetadata:
    def column(value, dtype):
        return np.asarray(value, dtype=dtype) if np.ndim(value) else np.full(num_rows, value, dtype=dtype)
    return SamplingMetadata(
        temperature=column(temperature, np.float32), top_k=column(top_k, np.int64),
        top_p=column(top_p, np.float32), min_p=column(min_p, np.float32),
        generators=[None] * num_rows, penalties=penalties or {}, num_logprobs=[None] * num_rows)


def draw(logits_rows: np.ndarray, meta: SamplingMetadata, seed: int = 0, bitmask=None, bitmask_rows=None):
    torch.manual_seed(seed)
    return Sampler()(torch.from_numpy(logits_rows.copy()), meta, bitmask, bitmask_rows).token_ids


def counts_of(token_ids: np.ndarray) -> np.ndarray:
    return np.bincount(token_ids, minlength=VOCAB)


def draw_counts(logits=LOGITS, seed: int = 0, **params) -> np.ndarray:
    rows = np.tile(logits, (NUM_DRAWS, 1))
    return counts_of(draw(rows, make_meta(NUM_DRAWS, **params), seed))


def test_the_check_rejects_a_wrong_distribution():
    # the statistic has the power the tests below rely on: argmax, uniform, or the wrong temperature fail it
    p = softmax(LOGITS)
    argmax = np.zeros(VOCAB, dtype=np.int64)
    argmax[0] = NUM_DRAWS
    assert chi_square(argmax, p) > 10 * chi_square_bound(VOCAB - 1)
    assert chi_square(np.full(VOCAB, NUM_DRAWS // VOCAB), p) > 10 * chi_square_bound(VOCAB - 1)
    assert chi_square(np.round(NUM_DRAWS * softmax(LOGITS / 0.7)).astype(int), p) > chi_square_bound(VOCAB - 1)


def test_temperature_one_draws_from_the_softmax():
    assert_distribution(draw_counts(temperature=1.0), softmax(LOGITS))


def test_temperature_sharpens_and_flattens():
    for temperature in (0.5, 2.0):
        counts = draw_counts(temperature=temperature, seed=1)
        assert_distribution(counts, softmax(LOGITS / temperature))
        assert chi_square(counts, softmax(LOGITS)) > chi_square_bound(VOCAB - 1)  # not temperature 1


def test_top_k_keeps_the_k_most_likely():
    for k in (2, 3, 5):
        assert_distribution(draw_counts(temperature=1.0, top_k=k, seed=k), keep_top_k(softmax(LOGITS), k))


def test_top_k_applies_after_temperature_and_past_the_vocabulary_is_off():
    assert_distribution(draw_counts(temperature=2.0, top_k=4, seed=3), keep_top_k(softmax(LOGITS / 2.0), 4))
    assert_distribution(draw_counts(temperature=1.0, top_k=VOCAB + 10, seed=4), softmax(LOGITS))


def test_top_p_keeps_the_smallest_set_reaching_p():
    p = softmax(LOGITS)  # about .37 .22 .14 .09 .06 .04 .02 .01
    for top_p, num_kept in ((0.5, 2), (0.7, 3), (0.9, 5)):
        expected = keep_top_p(p, top_p)
        assert (expected > 0).sum() == num_kept
        assert_distribution(draw_counts(temperature=1.0, top_p=top_p, seed=10 + num_kept), expected)


def test_min_p_drops_tokens_below_a_share_of_the_best():
    p = softmax(LOGITS)
    for min_p, num_kept in ((0.2, 4), (0.5, 2)):
        expected = keep_min_p(p, min_p)
        assert (expected > 0).sum() == num_kept
        assert_distribution(draw_counts(temperature=1.0, min_p=min_p, seed=20 + num_kept), expected)


def test_top_k_top_p_and_min_p_together():
    expected = keep_min_p(keep_top_p(keep_top_k(softmax(LOGITS / 1.5), 6), 0.95), 0.1)
    assert_distribution(draw_counts(temperature=1.5, top_k=6, top_p=0.95, min_p=0.1, seed=5), expected)


def test_sampling_under_a_bitmask_renormalises_over_the_allowed_tokens():
    allowed = [1, 4, 6]
    bitmask = torch.tensor([[sum(1 << i for i in allowed)]], dtype=torch.int32)
    rows = np.tile(LOGITS, (NUM_DRAWS, 1))
    counts = counts_of(draw(rows, make_meta(NUM_DRAWS, temperature=1.0), 6,
                            bitmask, np.zeros(NUM_DRAWS, dtype=np.int64)))
    masked = np.full(VOCAB, -np.inf, dtype=np.float32)
    masked[allowed] = LOGITS[allowed]
    assert_distribution(counts, softmax(masked))


# ---- penalties: the prompt and the output have different histories ----------------------

PROMPT_IDS = np.array([0, 0, 3], dtype=np.int64)
OUTPUT_IDS = np.array([1, 1, 1, 5, 3], dtype=np.int64)
PENALTY_LOGITS = np.array([1.2, 1.0, 0.8, -0.4, 0.5, -0.6, 0.0, 0.3], dtype=np.float32)


def draw_with_penalty(repetition: float, frequency: float, presence: float, seed: int) -> np.ndarray:
    all_ids = np.concatenate([PROMPT_IDS, OUTPUT_IDS])
    penalties = {row: (all_ids, OUTPUT_IDS, repetition, frequency, presence) for row in range(NUM_DRAWS)}
    rows = np.tile(PENALTY_LOGITS, (NUM_DRAWS, 1))
    return counts_of(draw(rows, make_meta(NUM_DRAWS, temperature=1.0, penalties=penalties), seed))


def test_frequency_penalty_counts_output_tokens_only():
    output_counts = np.bincount(OUTPUT_IDS, minlength=VOCAB)
    expected = softmax(PENALTY_LOGITS - 0.6 * output_counts)  # token 0, in the prompt only, is untouched
    counts = draw_with_penalty(1.0, 0.6, 0.0, seed=30)
    assert_distribution(counts, expected)
    assert chi_square(counts, softmax(PENALTY_LOGITS)) > chi_square_bound(VOCAB - 1)


def test_presence_penalty_is_once_per_output_token():
    present = (np.bincount(OUTPUT_IDS, minlength=VOCAB) > 0).astype(np.float32)
    counts = draw_with_penalty(1.0, 0.0, 0.9, seed=31)
    assert_distribution(counts, softmax(PENALTY_LOGITS - 0.9 * present))
    assert chi_square(counts, softmax(PENALTY_LOGITS)) > chi_square_bound(VOCAB - 1)


def test_repetition_penalty_covers_prompt_and_output_and_pushes_negative_logits_down():
    seen = np.unique(np.concatenate([PROMPT_IDS, OUTPUT_IDS]))  # 0, 1, 3 (negative), 5 (negative)
    penalised = PENALTY_LOGITS.copy()
    penalised[seen] = np.where(penalised[seen] > 0, penalised[seen] / 2.0, penalised[seen] * 2.0)
    counts = draw_with_penalty(2.0, 0.0, 0.0, seed=32)
    assert_distribution(counts, softmax(penalised))
    # dividing a negative logit would raise its probability instead
    wrong = PENALTY_LOGITS.copy()
    wrong[seen] = PENALTY_LOGITS[seen] / 2.0
    assert chi_square(counts, softmax(wrong)) > chi_square_bound(VOCAB - 1)


def test_all_penalties_together():
    seen = np.unique(np.concatenate([PROMPT_IDS, OUTPUT_IDS]))
    output_counts = np.bincount(OUTPUT_IDS, minlength=VOCAB)
    x = PENALTY_LOGITS.copy()
    x[seen] = np.where(x[seen] > 0, x[seen] / 1.5, x[seen] * 1.5)
    x = x - 0.3 * output_counts - 0.4 * (output_counts > 0)
    assert_distribution(draw_with_penalty(1.5, 0.3, 0.4, seed=33), softmax(x))


def test_greedy_rows_apply_penalties_before_the_argmax():
    all_ids = np.concatenate([PROMPT_IDS, OUTPUT_IDS])
    logits = np.tile(PENALTY_LOGITS, (2, 1))
    # row 0: token 0 (1.2) is repeated in the prompt: repetition 2 makes it 0.6 and token 2 (0.8) wins;
    # row 1: frequency counts the output only, so token 0 stays the best
    meta = make_meta(2, penalties={0: (all_ids, OUTPUT_IDS, 2.0, 0.0, 0.0), 1: (all_ids, OUTPUT_IDS, 1.0, 5.0, 0.0)})
    assert draw(logits, meta).tolist() == [2, 0]


# ---- one batch, different parameters per row -------------------------------------------

def test_each_row_samples_with_its_own_parameters():
    # four kinds of rows interleaved in one batch, each with its own logits
    group_logits = [LOGITS, LOGITS[::-1].copy(), np.roll(LOGITS, 3), np.roll(LOGITS, 5)]
    group_params = [dict(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0),  # greedy among sampled rows
                    dict(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0),
                    dict(temperature=0.7, top_k=0, top_p=0.8, min_p=0.0),
                    dict(temperature=1.5, top_k=0, top_p=1.0, min_p=0.2)]
    group_of_row = np.arange(NUM_DRAWS * 4) % 4
    rows = np.stack([group_logits[g] for g in group_of_row])
    columns = {name: np.array([group_params[g][name] for g in group_of_row]) for name in group_params[0]}
    # a penalty on the last group only: frequency 1 on token 5, its best token
    penalties = {row: (np.array([5], dtype=np.int64), np.array([5], dtype=np.int64), 1.0, 1.0, 0.0)
                 for row in np.flatnonzero(group_of_row == 3)}
    token_ids = draw(rows, make_meta(len(rows), penalties=penalties, **columns), seed=40)

    greedy = token_ids[group_of_row == 0]
    assert (greedy == np.argmax(group_logits[0])).all()
    assert_distribution(counts_of(token_ids[group_of_row == 1]), keep_top_k(softmax(group_logits[1]), 3))
    assert_distribution(counts_of(token_ids[group_of_row == 2]), keep_top_p(softmax(group_logits[2] / 0.7), 0.8))
    penalised = group_logits[3] - 1.0 * (np.arange(VOCAB) == 5)
    assert_distribution(counts_of(token_ids[group_of_row == 3]), keep_min_p(softmax(penalised / 1.5), 0.2))


def test_seeded_rows_draw_from_their_own_stream_in_any_order():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, VOCAB)).astype(np.float32) * 2
    seeds = [11, 12, 13, 14, 15, 16]
    meta_alone = [make_meta(1, temperature=1.0, top_k=4 if i % 2 else 0) for i in range(6)]
    alone = []
    for i in range(6):
        meta_alone[i].generators = [torch.Generator().manual_seed(seeds[i])]
        alone.append(int(draw(logits[i:i + 1], meta_alone[i], seed=99)[0]))
    order = [3, 0, 5, 1, 4, 2]
    batched_meta = make_meta(7, temperature=np.array([1.0] * 6 + [0.0]),
                             top_k=np.array([4 if i % 2 else 0 for i in order] + [0]))
    batched_meta.generators = [torch.Generator().manual_seed(seeds[i]) for i in order] + [None]
    batched = draw(np.concatenate([logits[order], logits[:1]]), batched_meta, seed=123)
    assert batched[:6].tolist() == [alone[i] for i in order]
    assert batched[6] == np.argmax(logits[0])


def test_logprobs_are_of_the_raw_logits_whatever_the_processing():
    logits = np.tile(PENALTY_LOGITS, (3, 1))
    meta = make_meta(3, temperature=np.array([0.5, 1.0, 0.0]), top_k=np.array([2, 0, 0]),
                     penalties={1: (np.array([0]), np.array([0]), 3.0, 1.0, 1.0)})
    meta.num_logprobs = [1, 0, None]
    torch.manual_seed(0)
    out = Sampler()(torch.from_numpy(logits.copy()), meta)
    raw = np.log(softmax(PENALTY_LOGITS))
    for row in (0, 1):
        lp = out.logprobs[row]
        assert lp.token_id == out.token_ids[row]
        assert abs(lp.logprob - raw[lp.token_id]) < 1e-5
    assert out.logprobs[0].top == [(0, out.logprobs[0].top[0][1])] and abs(out.logprobs[0].top[0][1] - raw[0]) < 1e-5
    assert out.logprobs[1].top == [] and out.logprobs[2] is None


def test_logprobs_line_up_with_their_rows():
    logits = np.tile(PENALTY_LOGITS, (3, 1))
    meta = make_meta(3, temperature=np.array([0.0, 1.0, 0.0]))
    assert Sampler()(torch.from_numpy(logits.copy()), meta).logprobs == [None, None, None]  # one per row
    meta.num_logprobs = [None, 2, None]
    out = Sampler()(torch.from_numpy(logits.copy()), meta)
    assert out.logprobs[0] is None and out.logprobs[2] is None
    assert out.logprobs[1].token_id == out.token_ids[1] and [t for t, _ in out.logprobs[1].top] == [0, 1]
