"""One request's llguidance matcher behind the Grammar ABC, the compiled grammar it is copied
from, and the matcher seen as a TextCursor for the closing search."""
from __future__ import annotations

from typing import TYPE_CHECKING

import llguidance as llg
import numpy as np

from grammar.backend import CompiledGrammar, Grammar, GrammarError
from grammar.llguidance.token_bitmask import allocate_token_bitmask, fill_next_token_bitmask
from grammar.runtime.closing_search import find_closing

if TYPE_CHECKING:
    import torch

    from grammar.backend import FirstFillBudget
    from grammar.runtime.char_tokens import CharTokens
    from grammar.runtime.jump_forward import ForcedTextTokenizer


_COMPILED_OVERHEAD_BYTES = 16 << 10  # the template matcher's parser state, roughly


class LLGuidanceCompiled(CompiledGrammar):
    """A validated llguidance grammar and a template matcher at its start; requests copy the
    template (the lexer built so far is shared, not rebuilt). Immutable to its users.

    `closing_hints`: words the closing search may need (grammar/runtime/closing_hints.py).
    """

    def __init__(self, template: llg.LLMatcher, grammar_text: str, kind: str, not_enforced: list[str],
                 closing_hints: list[str] | None = None) -> None:
        self.template = template
        self.kind = kind
        self.not_enforced = list(not_enforced)
        self.closing_hints = tuple(closing_hints or ())
        self.backend_name = "llguidance"
        self._num_bytes = len(grammar_text) + _COMPILED_OVERHEAD_BYTES

    @property
    def num_bytes(self) -> int:
        return self._num_bytes


class LLGuidanceGrammar(Grammar):
    """One request's LLMatcher. llguidance computes each mask when asked (no compiled mask
    table), so a fill costs about the same everywhere: tens of µs to a few ms.

    A rejected token would put llguidance's matcher in an error state for good, so every
    accept is validated first and only a fully valid list is consumed. Its parser limits can
    still fail a consume (too many Earley items in one step: `root ::= "a" root` after its first
    token): the matcher is then broken for good, so the consume raises a GrammarError with
    llguidance's reason, and the engine ends that request as its constraint's failure.
    """

    def __init__(self, compiled: LLGuidanceCompiled, forced_text: ForcedTextTokenizer, stop_token_ids: list[int],
                 vocab_size: int, max_forced_bytes: int, char_tokens: CharTokens | None,
                 llg_tokenizer: llg.LLTokenizer) -> None:
        self._matcher = compiled.template.deep_copy()
        self._forced_text = forced_text
        self._stop_token_ids = stop_token_ids
        self._vocab_size = vocab_size
        self._max_forced_bytes = max_forced_bytes
        self._char_tokens = char_tokens
        self._llg_tokenizer = llg_tokenizer
        self._closing_hints = compiled.closing_hints
        self.not_enforced = compiled.not_enforced
        self._token_ids: list[int] = []  # accepted so far, for rollback and the jump-forward seam
        self._scratch: torch.Tensor | None = None

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """llguidance writes 0 for ids past its vocabulary (the padding ids) itself."""
        self._raise_if_broken()
        fill_next_token_bitmask(self._matcher, bitmask, row)

    def accept_tokens(self, token_ids: list[int]) -> bool:
        if any(not (0 <= t < self._vocab_size) for t in token_ids):
            return False
        if not token_ids:
            return True
        self._raise_if_broken()
        if self._matcher.is_stopped() or self._matcher.validate_tokens(token_ids) < len(token_ids):
            return False
        if not self._matcher.consume_tokens(token_ids):  # validated above: one of its parser limits
            self._raise_if_broken()
        self._token_ids += token_ids
        return True

    def _raise_if_broken(self) -> None:
        if self._matcher.is_error():
            reason = self._matcher.get_error().split("\n")[0][:200]
            raise GrammarError(f"llguidance could not go on after {len(self._token_ids)} tokens: {reason}")

    def rollback(self, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        if num_tokens > len(self._token_ids):
            raise ValueError(f"cannot roll back {num_tokens} tokens; only {len(self._token_ids)} accepted")
        self._matcher.rollback(num_tokens)
        del self._token_ids[-num_tokens:]

    def is_terminated(self) -> bool:
        """llguidance stops once only a stop token may follow (a closed JSON object) and after one
        (and when broken, which is no end)."""
        return self._matcher.is_stopped() and not self._matcher.is_error()

    def jump_forward_token_ids(self) -> list[int]:
        """llguidance's forced bytes, tokenized and seam-checked as on xgrammar
        (grammar/runtime/jump_forward.py), at most max_forced_bytes per call."""
        if self._matcher.is_stopped():
            return []
        text = self._matcher.compute_ff_bytes()[:self._max_forced_bytes].decode("utf-8", errors="ignore")
        if not text:
            return []
        return self._forced_text.force(self, self._token_ids, text)

    def closing_token_ids(self, max_tokens: int, first_fills: FirstFillBudget | None = None, max_nodes: int = 1000,
                          max_cpu_s: float = 0.02) -> list[int] | None:
        """As on xgrammar: grammar/runtime/closing_search.py over this matcher, its text encoded by
        the model tokenizer, checked by accepting it and rolling back."""
        if self._char_tokens is None or max_tokens < 1 or self._matcher.is_stopped():
            return None
        cursor = _LLGuidanceCursor(self, self._scratch_row(), self._char_tokens)
        text = find_closing(cursor, min(4 * max_tokens + 16, self._max_forced_bytes), max_nodes, max_cpu_s,
                            self._closing_hints, first_fills)
        if text is None:
            return None
        return self._forced_text.closing(self, self._token_ids, text, self._stop_token_ids, max_tokens)

    def completes(self, token_ids: list[int], strict: bool = False) -> bool:
        if not token_ids or self._matcher.is_stopped() or not self.accept_tokens(token_ids):
            return False
        complete = self.is_terminated() if strict else self._matcher.is_accepting() or self._matcher.is_stopped()
        self.rollback(len(token_ids))
        return complete

    def _push_text(self, text: str) -> int | None:
        """Accept `text` as tokens (one character: its own token); their number, or None if refused."""
        token_id = self._char_tokens.token_id_of.get(text) if self._char_tokens is not None else None
        ids = [token_id] if token_id is not None else self._llg_tokenizer.tokenize_str(text)
        return len(ids) if ids and self.accept_tokens(ids) else None

    def _scratch_row(self) -> torch.Tensor:
        if self._scratch is None:
            self._scratch = allocate_token_bitmask(1, self._vocab_size)
        return self._scratch


class _LLGuidanceCursor:
    """The request's matcher as a TextCursor: a push accepts a text's tokens, a pop rolls back
    the tokens of the pushes it undoes, so the search leaves the matcher where it was."""

    def __init__(self, grammar: LLGuidanceGrammar, scratch: torch.Tensor, char_tokens: CharTokens) -> None:
        self._grammar = grammar
        self._scratch = scratch
        self._char_tokens = char_tokens
        self._pushed: list[int] = []  # tokens of each push, in order

    def allowed_chars(self) -> str:
        self._grammar.fill_bitmask(self._scratch, 0)
        return self._char_tokens.allowed(self._scratch.numpy().view(np.uint32)[0])

    def push(self, text: str) -> bool:
        num_tokens = self._grammar._push_text(text)
        if num_tokens is None:
            return False
        self._pushed.append(num_tokens)
        return True

    def pop(self, num_steps: int) -> None:
        num_tokens = sum(self._pushed[-num_steps:]) if num_steps else 0
        del self._pushed[len(self._pushed) - num_steps:]
        self._grammar.rollback(num_tokens)

    def forced_text(self) -> str:
        matcher = self._grammar._matcher
        return "" if matcher.is_stopped() else matcher.compute_ff_bytes().decode("utf-8", errors="ignore")

    def is_complete(self) -> bool:
        matcher = self._grammar._matcher
        return matcher.is_accepting() or matcher.is_stopped()
