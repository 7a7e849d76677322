"""The bitmask fills over GrammarConfig.max_fill_ms a request may have.

A fill that slow ends the request (a grammar whose every fill takes that long would hold back
every step of everyone's), except in a grammar whose token masks are built on first use: there a
state's first fill builds its mask and the state's later fills take microseconds, so its slow
fills may add up to `lazy_fill_budget_ms` of CPU time. The same rule judges the compile's walk.
The closing search (grammar/runtime/closing_search.py) keeps an account of its own for the first fills it
meets, so that searching never costs the request its decoding budget.
"""
from __future__ import annotations

from grammar.config import GrammarConfig


class SlowFills:
    """One request's (or one compile walk's) fills over max_fill_ms, and whether they may go on."""

    __slots__ = ("limit_ms", "budget_ms", "spent_ms")

    def __init__(self, config: GrammarConfig, lazy_masks: bool) -> None:
        self.limit_ms = config.max_fill_ms
        self.budget_ms = config.lazy_fill_budget_ms if lazy_masks else 0.0
        self.spent_ms = 0.0

    def allows(self, fill_ms: float) -> bool:
        """Count a fill that took `fill_ms` of CPU; False once the slow ones pass the budget."""
        return fill_ms <= self.limit_ms or self.spend(fill_ms)

    def spend(self, fill_ms: float) -> bool:
        """Count a first fill of any length (a FirstFillBudget for the closing search); False once
        the budget is spent, and always for an eagerly compiled grammar."""
        self.spent_ms += fill_ms
        return self.spent_ms <= self.budget_ms

    def limit_text(self) -> str:
        """The limit a refused fill passed, as the error names it."""
        if not self.budget_ms:
            return f"this server's max_fill_ms limit of {self.limit_ms:g}"
        return (f"this server's max_fill_ms limit of {self.limit_ms:g}, and its lazy_fill_budget_ms of "
                f"{self.budget_ms:g} for such fills ({self.spent_ms:.0f} ms so far)")
