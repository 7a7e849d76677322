"""A constrained request's grammar state: held by its Request, driven by the StructuredOutputManager."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grammar.backend import Grammar
    from grammar.constraint import Constraint
    from grammar.runtime.early_closing import EarlyClosing
    from grammar.runtime.slow_fills import SlowFills


class StructuredOutputRequest:
    """Everything the engine keeps about one request's constraint, from its compile on.

    The grammar objects are driven from the engine thread only; `grammar_ready_time` alone is also
    written by the compile's callback, on a compile thread, once."""

    __slots__ = ("constraint", "grammar", "closing", "slow_fills", "num_forced_tokens_pending", "closed_early",
                 "grammar_cache_hit", "grammar_ready_time", "grammar_backend")

    def __init__(self, constraint: Constraint) -> None:
        self.constraint = constraint
        self.grammar: Grammar | None = None  # its matcher, once compiled and activated
        self.closing: EarlyClosing | None = None  # set with the grammar when closing early is on
        self.slow_fills: SlowFills | None = None  # its fills over max_fill_ms, from the first one
        self.num_forced_tokens_pending = 0  # jump-forward tokens appended, not yet sent to the runner
        self.closed_early = ""  # why the engine closed the output (EngineCoreOutput.closed_early)
        self.grammar_cache_hit = False  # its compiled grammar was in the compile cache on arrival
        self.grammar_ready_time: float | None = None  # monotonic: its grammar compile ended (or failed)
        self.grammar_backend = ""  # the library that compiled its grammar, once activated

    def mark_grammar_ready(self, now: float) -> None:
        """The compile ended: on a compile thread (the future's callback) or the engine thread,
        whichever is first; later calls keep the first time."""
        if self.grammar_ready_time is None:
            self.grammar_ready_time = now
