"""An xgrammar GrammarMatcher seen as a TextCursor (grammar/runtime/closing_search.py).

Pushes are `accept_string` steps, pops are `rollback`, so the search works on the request's own
matcher and leaves it where it was. Which characters may come next is read from one bitmask fill:
the bits of the single-character tokens, rather than one trial accept per character.
The matcher object is passed in, so this module needs no import of xgrammar.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

    from grammar.runtime.char_tokens import CharTokens


class MatcherCursor:
    def __init__(self, matcher, scratch: torch.Tensor, char_tokens: CharTokens, use_forced_text: bool) -> None:
        """`scratch`: a one-row bitmask the cursor may overwrite. `use_forced_text`: False for a
        grammar whose forced-text search is not known to end (jump-forward is off for it too)."""
        self._matcher = matcher
        self._scratch = scratch
        self._char_tokens = char_tokens
        self._use_forced_text = use_forced_text

    def allowed_chars(self) -> str:
        self._matcher.fill_next_token_bitmask(self._scratch, 0)
        return self._char_tokens.allowed(self._scratch.numpy().view(np.uint32)[0])

    def push(self, text: str) -> bool:
        return self._matcher.accept_string(text)

    def pop(self, num_steps: int) -> None:
        self._matcher.rollback(num_steps)

    def forced_text(self) -> str:
        return self._matcher.find_jump_forward_string() if self._use_forced_text else ""

    def is_complete(self) -> bool:
        return self._matcher.is_completed()
