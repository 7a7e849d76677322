"""What a step costs by the number of tokens it computes, learned from the steps that ran.

Speculation trades rows for forward passes: verifying a draft adds its tokens to the step, and the
step takes longer by what those rows cost, which depends on where the step sits. Few rows: the step
is bound by reading the weights once and a row costs little; many rows: it is bound by the
multiply-adds and every row costs its share. No formula fits every machine and kernel, so the
engine measures: each step's time (planning to outputs: the drafts, the forward and the sampling of
every row; on CPU the time its threads ran, which other processes on a shared machine do not
stretch as they stretch the wall clock) goes into a moving average for its size, sizes in buckets
about 1.5x apart. A size not measured
yet is read between its measured neighbours, past the largest one along the last slope measured
(or `prior_per_token_s` when there is none), below the smallest as the smallest.
"""
from __future__ import annotations

import bisect

# bucket upper bounds (tokens in the step), about 1.5x apart, then doubling
_BOUNDS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096, 8192)
_SMOOTHING = 0.2  # weight of the newest step in its bucket's average


class StepCostModel:
    """Driven from the engine thread only."""

    def __init__(self, prior_per_token_s: float = 2e-4) -> None:
        self.prior_per_token_s = prior_per_token_s
        self._seconds: dict[int, float] = {}  # bucket bound -> moving average of a step's seconds
        self._known: list[int] = []  # sorted bounds that have a measurement

    def observe(self, num_tokens: int, seconds: float) -> None:
        """One step computed `num_tokens` tokens in `seconds`."""
        if num_tokens < 1 or num_tokens > _BOUNDS[-1] or seconds <= 0:
            return
        bound = _BOUNDS[bisect.bisect_left(_BOUNDS, num_tokens)]
        last = self._seconds.get(bound)
        if last is None:
            bisect.insort(self._known, bound)
            self._seconds[bound] = seconds
        else:
            self._seconds[bound] = last + _SMOOTHING * (seconds - last)

    @property
    def measured(self) -> bool:
        return bool(self._known)

    def seconds(self, num_tokens: int) -> float:
        """Estimated seconds of a step of `num_tokens` tokens (0.0 before any step was measured);
        never less than a smaller measured size took (noise must not make rows look free)."""
        known = self._known
        if not known:
            return 0.0
        at = self._seconds
        i = bisect.bisect_left(known, num_tokens)
        if i < len(known) and known[i] == num_tokens:
            estimate = at[num_tokens]
        elif i == 0:
            return at[known[0]]
        elif i == len(known):
            last = known[-1]
            slope = self.prior_per_token_s
            if len(known) > 1:
                before = known[-2]
                slope = max((at[last] - at[before]) / (last - before), 0.0)
            estimate = at[last] + slope * (num_tokens - last)
        else:
            low, high = known[i - 1], known[i]
            estimate = at[low] + (at[high] - at[low]) * (num_tokens - low) / (high - low)
        return max([estimate, *(at[b] for b in known[:i])])
