"""Sampled requests with drafts keep their distribution: every position of a draft is sampled as
usual and the draft is kept up to the first sample that differs (rejection sampling for a draft of
one fixed token per position), so the output tokens are distributed as without drafts.

A toy model over a vocabulary of 8: the logits after a token t are LOGITS rolled by t. The draft
[1, 2] is verified in one step for each of NUM_TRIALS requests; the first two output tokens (the
second one from a step of its own when the draft was rejected at once) are compared with the exact
joint probabilities, with the chi-square check of test_sampler_statistics.
"""
from __future__ import annotations

import numpy as np
import torch
from test_sampler_statistics import (LOGITS, VOCAB, assert_distribution, chi_square, chi_square_bound, keep_top_k,
                                     make_meta, softmax)

from engine.worker.draft_verification import num_accepted
from engine.worker.sampler import Sampler

NUM_TRIALS = 12000
DRAFT = [1, 2]
FIRST = 0  # the last token before the draft


def logits_after(token_id: int) -> np.ndarray:
    return np.roll(LOGITS, token_id)


def probs_after(token_id: int, temperature: float, top_k: int) -> np.ndarray:
    p = softmax(logits_after(token_id) / temperature)
    return keep_top_k(p, top_k) if top_k else p


def sample_rows(rows: np.ndarray, temperature: float, top_k: int) -> np.ndarray:
    meta = make_meta(len(rows), temperature=temperature, top_k=top_k)
    return Sampler()(torch.from_numpy(rows.astype(np.float32)), meta).token_ids


def speculative_outputs(temperature: float, top_k: int, seed: int) -> list[list[int]]:
    """Each trial's first tokens: the kept draft and the token after it, then (if only one token
    came) the next token sampled on its own, as the following step would."""
    torch.manual_seed(seed)
    rows = np.stack([logits_after(FIRST)] + [logits_after(t) for t in DRAFT])  # the draft's 1 + k positions
    chosen = sample_rows(np.tile(rows, (NUM_TRIALS, 1)), temperature, top_k).reshape(NUM_TRIALS, len(DRAFT) + 1)
    outputs = [list(c[:num_accepted(DRAFT, c) + 1]) for c in chosen.tolist()]
    alone = [i for i, out in enumerate(outputs) if len(out) == 1]
    following = sample_rows(np.stack([logits_after(outputs[i][0]) for i in alone]), temperature, top_k)
    for i, token_id in zip(alone, following.tolist()):
        outputs[i].append(token_id)
    return outputs


def joint_counts(outputs: list[list[int]]) -> np.ndarray:
    return np.bincount([out[0] * VOCAB + out[1] for out in outputs], minlength=VOCAB * VOCAB)


def exact_joint(temperature: float, top_k: int) -> np.ndarray:
    first = probs_after(FIRST, temperature, top_k)
    return np.concatenate([first[t] * probs_after(t, temperature, top_k) for t in range(VOCAB)])


def test_first_two_tokens_have_the_distribution_of_decoding_without_drafts():
    for temperature, top_k, seed in ((1.0, 0, 0), (0.7, 5, 1)):
        outputs = speculative_outputs(temperature, top_k, seed)
        assert_distribution(joint_counts(outputs), exact_joint(temperature, top_k))
        # the token after a fully kept draft (the bonus) has the distribution after the draft
        bonus = [out[2] for out in outputs if out[:2] == DRAFT]
        assert len(bonus) > 100
        assert_distribution(np.bincount(bonus, minlength=VOCAB), probs_after(DRAFT[-1], temperature, top_k))


def test_the_check_sees_a_draft_resampled_from_the_full_distribution():
    # the classic mistake: where the draft is not kept, draw again from p instead of p without the
    # draft token; the draft token then comes out too often, and the check must say so
    torch.manual_seed(2)
    rows = np.tile(logits_after(FIRST), (NUM_TRIALS, 1))
    first, again = sample_rows(rows, 1.0, 0), sample_rows(rows, 1.0, 0)
    wrong = np.where(first == DRAFT[0], first, again)
    expected = probs_after(FIRST, 1.0, 0)
    assert chi_square(np.bincount(wrong, minlength=VOCAB), expected) > chi_square_bound(VOCAB - 1)
