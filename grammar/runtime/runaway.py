"""Spotting a JSON output that has stopped saying anything new.

A small model under a grammar that allows it can loop until max_tokens: the same word again and
again inside a string, an integer with hundreds of digits, `{"data":{"data":…` without end, the
same array item or escape over and over. The guard watches the output tokens as they come and
names the first such pattern it sees, so the output can be closed there:

* "repetition": the last tokens are one block of up to `max_period` tokens repeated, at least
  `min_repeats` times and over at least `min_span` tokens (a 200-item array of distinct values or
  a long sentence never is);
* "digits": a number (outside strings) reaches `max_digits` digits in a row — past 64 bits for an
  integer, past what a double keeps for a fraction;
* "depth": objects and arrays nest deeper than `max_depth`.

Per token it costs one comparison per period and a scan of the token's few bytes.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

_QUOTE, _BACKSLASH = 0x22, 0x5C
_OPEN, _CLOSE = frozenset(b"{["), frozenset(b"}]")
_DIGITS = frozenset(b"0123456789")


@dataclass(frozen=True)
class RunawayLimits:
    max_period: int = 64  # tokens in the repeated block (an array item of a few fields)
    min_repeats: int = 4
    min_span: int = 32  # tokens the repetition covers, at least
    max_digits: int = 19  # int64 holds every 18-digit integer, not every 19-digit one
    max_depth: int = 16

    def __post_init__(self) -> None:
        for name in ("max_period", "min_repeats", "min_span", "max_digits", "max_depth"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


class RunawayGuard:
    """One request's watcher. Feed it every output token, in order (sampled and forced)."""

    def __init__(self, token_bytes: Sequence[bytes], limits: RunawayLimits = RunawayLimits()) -> None:
        """`token_bytes`: each token id's bytes (an id past its end has none)."""
        self._token_bytes = token_bytes
        self.limits = limits
        self._history: list[int] = []  # the last max_period tokens, and the new one
        # period -> how many latest tokens equal the token `period` places before them
        self._runs = [0] * (limits.max_period + 1)
        self._in_string = self._escaped = False
        self._depth = self._digits = 0

    def update(self, token_ids: Sequence[int]) -> str | None:
        """Take new output tokens; the reason to close the output now, or None."""
        reason = None
        for token_id in token_ids:
            found = self._repeats(token_id) or self._lex(token_id)
            reason = reason or found
        return reason

    def reset_repetition(self) -> None:
        """Forget the repetition seen so far (after a closing that could not be done)."""
        self._runs = [0] * len(self._runs)

    def _repeats(self, token_id: int) -> str | None:
        history, runs, limits = self._history, self._runs, self.limits
        history.append(token_id)
        if len(history) > limits.max_period + 1:
            del history[0]
        last = len(history) - 1
        found = None
        for period in range(1, limits.max_period + 1):
            if period <= last and history[last - period] == token_id:
                runs[period] += 1
                if found is None and runs[period] + period >= max(limits.min_repeats * period, limits.min_span):
                    found = "repetition"
            else:
                runs[period] = 0
        return found

    def _lex(self, token_id: int) -> str | None:
        """Track strings, nesting and digit runs over the token's bytes."""
        data = self._token_bytes[token_id] if 0 <= token_id < len(self._token_bytes) else b""
        found = None
        for byte in data:
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif byte == _BACKSLASH:
                    self._escaped = True
                elif byte == _QUOTE:
                    self._in_string = False
                continue
            if byte in _DIGITS:
                self._digits += 1
                if self._digits >= self.limits.max_digits:
                    found = found or "digits"
                continue
            self._digits = 0
            if byte == _QUOTE:
                self._in_string = True
            elif byte in _OPEN:
                self._depth += 1
                if self._depth > self.limits.max_depth:
                    found = found or "depth"
            elif byte in _CLOSE:
                self._depth -= 1
        return found
