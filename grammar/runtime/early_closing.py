"""When a constrained output is closed before it would run out of tokens, and why.

Without this, an output cut at max_tokens (or at the context length) is a prefix: unusable JSON.
One `EarlyClosing` per request watches the remaining budget and, for the JSON kinds, the runaway
guard (grammar/runtime/runaway.py). When the budget comes within a few tokens of the closing the grammar
needs (Grammar.closing_token_ids), or the guard sees a loop, it hands the scheduler that closing to
append, with the reason ("budget", "repetition", "digits", "depth"); the output then completes,
validates, and says it was closed.

The closing is searched for only when it may matter: after each search, the next one waits until
the budget has used up half of its lead over the longest closing seen so far, so a long output
costs a handful of searches, and the last stretch (twice that closing) one check per step, unless
the grammar is compiled lazily (there each search pays first fills: it keeps halving). A check
first tries the closing the last search found, and then its ends (the output may have gone its
way for a few tokens: the string closed, the next key forced), from where the output now stands
(Grammar.completes: accept, look, roll back, no bitmask fill); while one still completes the
output — the rest of one long string — the shortest closing is no longer than it and there is
nothing to search for, until it is time to close: then the search runs, and that earlier closing
is the fallback if it misses or finds a longer one. A search that finds nothing is retried the
same way, halving the lead that is left, so the last tries still come before the budget falls
below that closing. The longest closing seen, not the current one, decides when to close: inside
a repeated array item the closing is short, at the start of the next item it is the whole item
again. An output that finishes before the closing acts is exactly what it would be without it:
nothing here changes the bitmask or the sampled tokens.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from grammar.backend import GrammarError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from grammar.backend import Grammar
    from grammar.runtime.runaway import RunawayGuard
    from grammar.runtime.slow_fills import SlowFills

logger = logging.getLogger(__name__)

# tokens kept in hand beyond the closing's own: the next sampled token, and the closing growing
# by a token or two on the way
_MARGIN = 3
# the search for the shortest output before anything is generated may look this far
_MINIMUM_SEARCH_TOKENS = 4096
# the compile-time search's budget (a step's is 1,000 nodes and 20 ms): a schema with a thousand
# required properties has a shortest output of 1,000+ tokens, found in 30-60 ms
_COMPILE_SEARCH_NODES = 20_000
_COMPILE_SEARCH_CPU_S = 1.0


def shortest_output_tokens(grammar: Grammar) -> int | None:
    """The tokens of the shortest output `grammar` (a fresh matcher) accepts, searched for with a
    budget a step could not afford: for the compile thread (CompiledGrammar.min_output_tokens).
    None when the search finds none: too long, too costly, or an output that never ends."""
    try:
        closing = grammar.closing_token_ids(_MINIMUM_SEARCH_TOKENS, max_nodes=_COMPILE_SEARCH_NODES,
                                            max_cpu_s=_COMPILE_SEARCH_CPU_S)
    except Exception as e:  # the closing is an extra: its failure is not the grammar's
        logger.warning("shortest-output search failed: %s: %s", type(e).__name__, e)
        return None
    return None if closing is None else len(closing)


class EarlyClosing:
    """Budget-aware closing and the runaway guard for one request. Driven by the engine thread."""

    def __init__(self, grammar: Grammar, guard: RunawayGuard | None = None,
                 first_fills: SlowFills | None = None) -> None:
        """`first_fills`: what the searches may spend waiting for a lazily compiled grammar's first
        fills, beyond their own CPU limit (see grammar/runtime/closing_search.py); None: nothing."""
        self._grammar = grammar
        self._guard = guard
        self._first_fills = first_fills
        self._check_at = 0  # search again once the remaining budget is at or below this
        self._max_closing = 0  # tokens of the longest closing found so far
        self._last_closing: list[int] | None = None  # the closing the last search found
        self._broken = False  # a search raised: no more closing for this request

    def check_minimum(self, num_budget_tokens: int, by_context: bool = False,
                      min_output_tokens: int | None = None) -> None:
        """Before the first token: raise GrammarError if the shortest output found for this
        constraint needs more than `num_budget_tokens` — the request's max_tokens, or (by_context)
        the context left after its prompt. `min_output_tokens`: that shortest output's length if
        the compile found it (CompiledGrammar.min_output_tokens); else it is searched for here."""
        needed = min_output_tokens
        if needed is None:
            closing = self._closing(max(num_budget_tokens, _MINIMUM_SEARCH_TOKENS))
            if closing is None:
                self._check_at = num_budget_tokens  # unknown: look again at the first token
                return
            needed = len(closing)
            self._last_closing = closing
        if needed > num_budget_tokens:
            if by_context:
                raise GrammarError(f"only {num_budget_tokens} tokens of context are left after the prompt, but the "
                                   f"shortest output this constraint accepts takes {needed}: shorten the prompt")
            raise GrammarError(f"max_tokens is {num_budget_tokens}, but the shortest output this constraint "
                               f"accepts takes {needed} tokens: set max_tokens to at least {needed}")
        self._max_closing = needed
        self._schedule(needed, num_budget_tokens)

    def check(self, new_token_ids: Sequence[int], num_remaining: int) -> tuple[list[int], str] | None:
        """After a step appended `new_token_ids` and `num_remaining` tokens of budget are left:
        (the closing tokens to append, why) when the output should be closed now, else None.
        The closing tokens are not accepted by the grammar yet."""
        if self._broken:
            return None
        reason = self._guard.update(new_token_ids) if self._guard is not None else None
        if reason is None and num_remaining > self._check_at:
            return None
        due = reason is not None or self._max_closing + _MARGIN >= num_remaining
        if not due and self._last_still_closes():
            # the shortest closing is no longer than that one now (give or take the seam's
            # retokenization, which _MARGIN covers): the longest seen stands, no search needed
            self._schedule(self._max_closing, num_remaining)
            return None
        last = self._last_closing
        closing = None if self._broken else self._closing(num_remaining)
        if (due and last is not None and (closing is None or len(last) < len(closing))
                and len(last) <= num_remaining and self._completes(last, strict=True)):
            closing = last  # the search missed it, or found a longer one: it is still valid
        if self._broken:
            return None
        self._last_closing = closing
        if closing is None:
            # nothing fits (or the search gave up): back off, and let a loop run on rather than
            # searching again at every token; but look again before the budget falls below the
            # longest closing seen, while one may still fit
            if self._guard is not None:
                self._guard.reset_repetition()
            lead = num_remaining - (self._max_closing + _MARGIN)
            retry_at = num_remaining - (lead + 1) // 2 if lead > _MARGIN else num_remaining // 2
            self._check_at = min(self._check_at, retry_at)
            return None
        self._max_closing = max(self._max_closing, len(closing))
        if reason is None and self._max_closing + _MARGIN < num_remaining:
            self._schedule(self._max_closing, num_remaining)
            return None
        return closing, reason or "budget"

    def _last_still_closes(self) -> bool:
        """The last closing found, or its end, still completes the output from here; the part that
        does is kept as the last closing. Its end: the output may have gone the closing's way for a
        few tokens (the string closed, the next required key forced)."""
        last = self._last_closing
        for start in range(len(last) if last is not None else 0):
            if self._completes(last[start:]):
                self._last_closing = last[start:]
                return True
        return False

    def _completes(self, closing: list[int] | None, strict: bool = False) -> bool:
        """`closing`, found earlier, still completes the output from here (Grammar.completes)."""
        if closing is None or self._broken:
            return False
        try:
            return self._grammar.completes(closing, strict)
        except Exception as e:  # as with a search: only this request's closing is lost
            logger.warning("closing check failed: %s: %s", type(e).__name__, e)
            self._broken = True
            return False

    def _closing(self, max_tokens: int) -> list[int] | None:
        """The grammar's closing; a search that raises only costs this request its closing."""
        try:
            return self._grammar.closing_token_ids(max_tokens, self._first_fills)
        except Exception as e:  # e.g. MemoryError in the matcher: the output goes on unclosed
            logger.warning("closing search failed: %s: %s", type(e).__name__, e)
            self._broken = True
            return None

    def _schedule(self, num_closing_tokens: int, num_remaining: int) -> None:
        due = num_closing_tokens + _MARGIN
        lead = num_remaining - due
        # within twice the closing of the end: every step (the closing may grow from one to the
        # next) — but in a lazily compiled grammar each search meets states of its own to build
        # (tens of ms each time), so there the lead keeps halving, which nears every step at the end
        every_step = lead <= due and self._first_fills is None
        self._check_at = num_remaining if every_step else due + lead // 2
