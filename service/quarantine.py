"""Constraints suspected of killing the engine, refused for a while.

A strike is an incident a constraint may have caused: the engine died while it was in flight, or
the engine ran short of memory while it compiled. The fingerprint is the constraint's cache key
(kind, canonical spec, options): the grammar is the part of a request that can run away, and a
hostile client resending a poison constraint varies the prompt for free. A constraint with
`strikes` strikes within `duration_s` is refused for `duration_s` from the last of them. A popular
constraint in flight at two unrelated deaths is refused too: the price of not crash-looping; 0 s
turns quarantine off. Unconstrained requests are never quarantined.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grammar.constraint import Constraint


class Quarantine:
    """Not thread-safe: used from the front end's event loop."""

    def __init__(self, duration_s: float, strikes: int = 2, clock: Callable[[], float] = time.monotonic) -> None:
        if duration_s < 0:
            raise ValueError(f"the quarantine time must be >= 0 s, got {duration_s}")
        if strikes < 1:
            raise ValueError(f"strikes must be >= 1, got {strikes}")
        self.duration_s = duration_s
        self.strikes = strikes
        self._clock = clock
        self._strikes: dict[tuple, list[float]] = {}  # cache key -> times of its strikes
        self._refused_until: dict[tuple, float] = {}  # cache key -> end of its quarantine

    def record_strike(self, constraints: Iterable[Constraint]) -> list[Constraint]:
        """One incident with these constraints in flight (each key gets one strike); returns those
        that are quarantined from now."""
        if self.duration_s == 0:
            return []
        now = self._clock()
        self._forget_expired(now)
        quarantined = []
        for key, constraint in {_key(c): c for c in constraints}.items():
            strikes = self._strikes.setdefault(key, [])
            strikes.append(now)
            if len(strikes) >= self.strikes and key not in self._refused_until:
                self._refused_until[key] = now + self.duration_s
                quarantined.append(constraint)
        return quarantined

    def remaining_s(self, constraint: Constraint) -> float | None:
        """Seconds left in this constraint's quarantine; None if it is not quarantined."""
        if not self._refused_until:  # the common case costs no cache key
            return None
        now = self._clock()
        until = self._refused_until.get(_key(constraint))
        if until is None or until <= now:
            return None
        return until - now

    @property
    def num_quarantined(self) -> int:
        now = self._clock()
        return sum(until > now for until in self._refused_until.values())

    def _forget_expired(self, now: float) -> None:
        for key, strikes in list(self._strikes.items()):
            strikes[:] = [t for t in strikes if now - t < self.duration_s]
            if not strikes:
                del self._strikes[key]
        for key, until in list(self._refused_until.items()):
            if until <= now:
                del self._refused_until[key]
                self._strikes.pop(key, None)  # a fresh start after serving its time


def _key(constraint: Constraint) -> tuple:
    try:
        return constraint.cache_key
    except (ValueError, RecursionError):  # unparsable spec: its text is its identity
        return (constraint.kind, constraint.spec, tuple(constraint.choices))
