"""A compiled grammar and its matcher with distinct strings enforced in the arrays that need it:
`uniqueItems` over free strings (grammar/json_schema/unique_strings.py), on either backend.

The backend compiles the schema without those uniqueItems; the matcher here wraps the backend's
and runs grammar/runtime/unique_strings.py's tracker over every token it accepts. In such an
array, a token that would close an element equal to an earlier one is masked out of the bitmask
and refused by accept_tokens; a closing or a forced text that would do so is not used. Only the
tokens that hold a quote can close a string, so only those are tried, and only while the
innermost open container is such an array.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from grammar.backend import CompiledGrammar, Grammar
from grammar.runtime.unique_strings import UniqueStringsTracker

if TYPE_CHECKING:
    import torch

    from grammar.backend import FirstFillBudget

_QUOTE = 0x22


def quote_token_ids(token_bytes: Sequence[bytes]) -> list[int]:
    """The tokens that can close a string: those whose bytes hold a quote."""
    return [i for i, data in enumerate(token_bytes) if _QUOTE in data]


class UniqueStringsCompiled(CompiledGrammar):
    """The backend's compiled grammar and the path tree to the arrays of distinct strings."""

    def __init__(self, inner: CompiledGrammar, paths: dict) -> None:
        self.inner = inner
        self.paths = paths
        self.not_enforced = inner.not_enforced
        self.min_output_tokens = inner.min_output_tokens
        self.lazy_masks = inner.lazy_masks
        self.backend_name = inner.backend_name

    @property
    def num_bytes(self) -> int:
        return self.inner.num_bytes


class UniqueStringsGrammar(Grammar):
    """The backend's matcher, and the tracker's state after each token it accepted (rollback
    steps back to one)."""

    def __init__(self, inner: Grammar, paths: dict, token_bytes: Sequence[bytes], quote_token_ids: Sequence[int]) -> None:
        """`quote_token_ids`: the ids whose bytes hold a quote (quote_token_ids(token_bytes), once per tokenizer)."""
        self._inner = inner
        self._paths = paths
        self._token_bytes = token_bytes
        self._quote_token_ids = np.asarray(quote_token_ids, dtype=np.int64)
        self._tracker = UniqueStringsTracker(paths)
        self._states: list[UniqueStringsTracker] = []  # after each accepted token (never changed in place)
        self.not_enforced = inner.not_enforced
        self.lazy_masks = inner.lazy_masks

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self._inner.fill_bitmask(bitmask, row)
        if not self._tracker.in_unique_array:
            return
        words = bitmask.numpy().view(np.uint32)
        ids = self._quote_token_ids
        allowed = ids[(words[row, ids >> 5] >> (ids & 31)) & 1 == 1]  # the few the grammar allows here
        for token_id in allowed.tolist():
            if not self._tracker.clone().feed(self._token_bytes[token_id]):
                words[row, token_id >> 5] &= ~np.uint32(1 << (token_id & 31))

    def accept_tokens(self, token_ids: list[int]) -> bool:
        states = self._states_after(token_ids)
        if states is None or not self._inner.accept_tokens(token_ids):
            return False
        self._take(states)
        return True

    def rollback(self, num_tokens: int) -> None:
        self._inner.rollback(num_tokens)
        if num_tokens <= 0:
            return
        del self._states[-num_tokens:]
        self._tracker = self._states[-1] if self._states else UniqueStringsTracker(self._paths)

    def is_terminated(self) -> bool:
        return self._inner.is_terminated()

    def jump_forward_token_ids(self) -> list[int]:
        forced = self._inner.jump_forward_token_ids()
        states = self._states_after(forced)
        if states is None:  # forced text that would repeat an element: not taken
            self._inner.rollback(len(forced))
            return []
        self._take(states)
        return forced

    def closing_token_ids(self, max_tokens: int, first_fills: FirstFillBudget | None = None, max_nodes: int = 1000,
                          max_cpu_s: float = 0.02) -> list[int] | None:
        closing = self._inner.closing_token_ids(max_tokens, first_fills, max_nodes, max_cpu_s)
        return closing if closing is not None and self._states_after(closing) is not None else None

    def completes(self, token_ids: list[int], strict: bool = False) -> bool:
        return self._states_after(token_ids) is not None and self._inner.completes(token_ids, strict)

    def _states_after(self, token_ids: list[int]) -> list[UniqueStringsTracker] | None:
        """The tracker after each of `token_ids`, or None where they would repeat an element."""
        states, tracker, size = [], self._tracker, len(self._token_bytes)
        for token_id in token_ids:
            tracker = tracker.clone()
            if not tracker.feed(self._token_bytes[token_id] if 0 <= token_id < size else b""):
                return None
            states.append(tracker)
        return states

    def _take(self, states: list[UniqueStringsTracker]) -> None:
        self._states += states
        if states:
            self._tracker = states[-1]
