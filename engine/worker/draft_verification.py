"""Verifying drafts in the runner: which positions need logits, and how much of a draft is kept.

A request with a draft of k tokens is scheduled for its own tokens and then the draft; logits at
its last 1 + k positions give the model's distribution for the next token and after each draft
token. Each position is sampled as usual (argmax for greedy requests) and the draft is kept up to
the first position whose token differs from it; that position's token follows (the bonus token
when the whole draft is kept): 1 to k + 1 tokens from one forward pass.

Greedy, these are exactly the tokens decoding without drafts gives. Sampled, this is rejection
sampling for a draft that is one fixed token per position (an n-gram draft): the draft token is
kept with its probability p(d), and a token sampled where it is not kept is distributed as p
without d, renormalised, which is the rejection-sampling residual (p - q)+ for q = one-hot(d);
so every output token has exactly the distribution decoding without drafts gives it.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def draft_logits_indices(logits_indices: np.ndarray, num_draft_tokens: np.ndarray) -> np.ndarray:
    """Flat token indices to compute logits at: for each request, the last 1 + num_draft_tokens
    of its scheduled tokens, in order. `logits_indices`: each request's last scheduled token."""
    counts = 1 + num_draft_tokens.astype(np.int64)
    first = logits_indices.astype(np.int64) - num_draft_tokens
    offsets = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(first, counts) + offsets


def num_accepted(draft: Sequence[int], chosen: Sequence[int]) -> int:
    """How many draft tokens are kept: `chosen[i]` is the token sampled (or picked greedily) after
    the draft's first i tokens, len(draft) + 1 of them."""
    count = 0
    while count < len(draft) and chosen[count] == draft[count]:
        count += 1
    return count
