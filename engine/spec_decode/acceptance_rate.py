"""How often a request's draft tokens are accepted, recent drafts weighing most.

Drafts from the prompt are accepted in runs: while the output copies a span of the input they are
taken whole, between spans they fail at once. So the rate forgets: each new draft's outcome
counts fully and the older ones fade, and a request that stopped drafting fades back to the prior
(the rate of all recent drafts) and tries again.
"""
from __future__ import annotations

REQUEST_DECAY = 0.7  # a request's older drafts fade fast: it copies a span, then writes its own text
_PRIOR_WEIGHT = 2.0  # drafts' worth of tried tokens the prior counts for


class AcceptanceRate:
    """Draft tokens accepted per token tried, over recent drafts (older ones weigh less).

    A draft of k tokens of which a were accepted tried a + 1 tokens when a < k (the first
    rejected one ends it) and a when a == k: the rate is accepted / tried."""

    __slots__ = ("decay", "accepted", "tried")

    def __init__(self, decay: float = REQUEST_DECAY) -> None:
        self.decay = decay  # what an outcome weighs one draft later
        self.accepted = 0.0
        self.tried = 0.0

    def add(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """One verified draft's outcome; (0, 0): a step without a draft, the old outcomes fade."""
        self.accepted = self.accepted * self.decay + num_accepted_tokens
        self.tried = self.tried * self.decay + num_accepted_tokens + (num_accepted_tokens < num_draft_tokens)

    def rate(self, prior: float) -> float:
        """The rate, with `prior` weighing as much as a couple of drafts."""
        return (self.accepted + prior * _PRIOR_WEIGHT) / (self.tried + _PRIOR_WEIGHT)
