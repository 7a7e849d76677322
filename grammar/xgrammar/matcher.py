"""One request's xgrammar matcher behind the Grammar ABC, the compiled grammar it is built from,
and xgrammar's own bitmask kernels (the CUDA one behind grammar.bitmask's device hook)."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np
import torch
import xgrammar as xgr

from grammar import bitmask as bitmask_ops
from grammar.backend import CompiledGrammar, Grammar
from grammar.runtime.char_tokens import CharTokens
from grammar.runtime.closing_search import find_closing
from grammar.runtime.jump_forward import ForcedTextTokenizer
from grammar.xgrammar.matcher_cursor import MatcherCursor

if TYPE_CHECKING:
    from collections.abc import Sequence

    from grammar.backend import FirstFillBudget


class XGrammarCompiled(CompiledGrammar):
    """A compiled xgrammar grammar plus what it does not enforce. Immutable, shareable.

    `jump_forward_safe`: the static check bounded the text this grammar can force (see
    grammar/xgrammar/output_bounds.py); without that bound, xgrammar's forced-text search could run without
    end, so jump-forward stays off for the grammar. `closing_hints`: words the closing search may
    need (grammar/runtime/closing_hints.py). `json_output`: the whole output is one JSON document (a JSON
    kind without a think section), which a closing must keep parseable.
    """

    def __init__(self, compiled: xgr.CompiledGrammar, kind: str, not_enforced: list[str],
                 jump_forward_safe: bool = True, closing_hints: list[str] | None = None,
                 json_output: bool = False, lazy_masks: bool = False) -> None:
        self.compiled = compiled
        self.lazy_masks = lazy_masks
        self.kind = kind
        self.not_enforced = list(not_enforced)
        self.jump_forward_safe = jump_forward_safe
        self.closing_hints = tuple(closing_hints or ())
        self.json_output = json_output
        self.backend_name = "xgrammar"
        self._num_bytes = compiled.memory_size_bytes + 256  # + this wrapper, roughly

    @property
    def num_bytes(self) -> int:
        if self.lazy_masks:  # the masks built so far count too (reading it takes ~1 us)
            return self.compiled.memory_size_bytes + 256
        return self._num_bytes


class XGrammarGrammar(Grammar):
    """One request's GrammarMatcher plus the token history that rollback and jump-forward need."""

    def __init__(self, compiled: XGrammarCompiled, forced_text: ForcedTextTokenizer,
                 stop_token_ids: list[int], vocab_size: int, max_forced_bytes: int,
                 char_tokens: CharTokens | None = None, token_bytes: Sequence[bytes] | None = None) -> None:
        """`token_bytes`: each token id's bytes, to check that a JSON output's closing parses."""
        self._matcher = xgr.GrammarMatcher(compiled.compiled)
        self.lazy_masks = compiled.lazy_masks
        self._char_tokens = char_tokens
        self._jump_forward_safe = compiled.jump_forward_safe
        self._closing_hints = compiled.closing_hints
        self._json_token_bytes = token_bytes if compiled.json_output else None
        self._max_forced_bytes = max_forced_bytes
        self._forced_text = forced_text
        self._stop_token_ids = stop_token_ids
        self._vocab_size = vocab_size
        self.not_enforced = compiled.not_enforced
        self._token_ids: list[int] = []  # accepted so far, for rollback and the jump-forward seam
        self._scratch: torch.Tensor | None = None  # one bitmask row: the end-of-output check, the closing search
        self._ended_at: tuple[int, bool] | None = None  # (len(_token_ids), answer) cache

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Also clears the last word's bits past vocab_size, which xgrammar leaves set, so that
        "no bit set" reliably means "nothing allowed"."""
        self._matcher.fill_next_token_bitmask(bitmask, row)
        if self._vocab_size % 32:
            words = bitmask.numpy().view(np.uint32)
            words[row, self._vocab_size >> 5] &= np.uint32((1 << (self._vocab_size % 32)) - 1)

    def accept_tokens(self, token_ids: list[int]) -> bool:
        """All or nothing: on a rejected token the matcher is rolled back to where it was."""
        for num_accepted, token_id in enumerate(token_ids):
            if not (0 <= token_id < self._vocab_size) or not self._matcher.accept_token(token_id):
                if num_accepted:
                    self._matcher.rollback(num_accepted)
                    del self._token_ids[-num_accepted:]
                return False
            self._token_ids.append(token_id)
        return True

    def rollback(self, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        if num_tokens > len(self._token_ids):
            raise ValueError(f"cannot roll back {num_tokens} tokens; only {len(self._token_ids)} accepted")
        self._matcher.rollback(num_tokens)
        del self._token_ids[-num_tokens:]
        if self._ended_at is not None and self._ended_at[0] > len(self._token_ids):
            self._ended_at = None  # about a state that is gone; a later one may reach that length

    def is_terminated(self) -> bool:
        """True after a stop token, or once the output is complete and nothing may follow it
        (the closing brace of a JSON object) — the engine need not wait for an EOS then."""
        if self._matcher.is_terminated():
            return True
        if not self._matcher.is_completed():
            return False
        if self._ended_at is not None and self._ended_at[0] == len(self._token_ids):
            return self._ended_at[1]
        self._matcher.fill_next_token_bitmask(self._scratch_row(), 0)
        words = self._scratch.numpy().view(np.uint32)[0].copy()
        for token_id in self._stop_token_ids:
            words[token_id >> 5] &= np.uint32(~(1 << (token_id & 31)) & 0xFFFFFFFF)
        ended = not words.any()
        self._ended_at = (len(self._token_ids), ended)
        return ended

    def jump_forward_token_ids(self) -> list[int]:
        """Forced tokens, already accepted; see grammar/runtime/jump_forward.py for what "safe" means.

        The head seam is checked against the last accepted token. Every forced token is
        accepted through the matcher; if one is rejected, nothing is forced. The tail chunk is
        kept only when the grammar ends right after the forced text. At most max_forced_bytes of
        text is taken per call; the rest stays forced and comes in later steps.
        """
        if not self._jump_forward_safe or self._matcher.is_terminated():
            return []
        text = self._matcher.find_jump_forward_string()
        if not text:
            return []
        encoded = text.encode()
        if len(encoded) > self._max_forced_bytes:
            text = encoded[:self._max_forced_bytes].decode("utf-8", errors="ignore")
        return self._forced_text.force(self, self._token_ids, text)

    def closing_token_ids(self, max_tokens: int, first_fills: FirstFillBudget | None = None, max_nodes: int = 1000,
                          max_cpu_s: float = 0.02) -> list[int] | None:
        """The closing text comes from grammar/runtime/closing_search.py on this matcher (`max_nodes`,
        `max_cpu_s`, `first_fills`: its budget); its tokens are the model tokenizer's (checked at the seam like
        jump-forward, else its plain encoding), validated by accepting them and rolling them back."""
        if self._char_tokens is None or max_tokens < 1 or self._matcher.is_terminated():
            return None
        cursor = MatcherCursor(self._matcher, self._scratch_row(), self._char_tokens, self._jump_forward_safe)
        text = find_closing(cursor, min(4 * max_tokens + 16, self._max_forced_bytes), max_nodes, max_cpu_s,
                            self._closing_hints, first_fills)
        if text is None:
            return None
        return self._forced_text.closing(self, self._token_ids, text, self._stop_token_ids, max_tokens,
                                         check=self._parses_as_json)

    def completes(self, token_ids: list[int], strict: bool = False) -> bool:
        """Accepting and rolling back the tokens costs a few µs each; without `strict` no bitmask
        is filled, so this is far cheaper than a search."""
        if not token_ids or self._matcher.is_terminated():
            return False
        if strict and not self._parses_as_json(token_ids):
            return False
        if not self.accept_tokens(token_ids):
            return False
        if strict:
            complete = self.is_terminated()
        else:
            complete = self._matcher.is_terminated() or self._matcher.is_completed()
        self.rollback(len(token_ids))
        return complete

    def _parses_as_json(self, closing_ids: list[int]) -> bool:
        """The output with this closing is JSON (True when that is not asked). xgrammar 0.2.9
        matches a schema's `pattern` against the raw JSON text, so a pattern that needs a
        backslash (`[\\\\]`) accepts one that is no JSON escape: such a closing is refused."""
        token_bytes = self._json_token_bytes
        if token_bytes is None:
            return True
        text = b"".join(token_bytes[t] for t in self._token_ids + closing_ids if 0 <= t < len(token_bytes))
        try:
            json.loads(text)
        except ValueError:
            return False
        return True

    def _scratch_row(self) -> torch.Tensor:
        if self._scratch is None:
            self._scratch = xgr.allocate_token_bitmask(1, self._vocab_size)
        return self._scratch


def apply_bitmask_xgrammar(logits: torch.Tensor, bitmask: torch.Tensor, row_indices: list[int] | None) -> None:
    """xgrammar's own kernel (CUDA, or its CPU loop): bitmask rows aligned with logits rows;
    row_indices: the rows to mask (None: all)."""
    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True), indices=row_indices)


# xgrammar's CUDA kernel behind grammar.bitmask's device hook, so that module stays library-free
bitmask_ops.register_device_kernel("cuda", apply_bitmask_xgrammar)


def hf_logits_processor(compiled: list[CompiledGrammar]):
    """xgrammar's own logits processor for transformers' generate, one grammar per batch row.

    Only the benchmarks use it: it is the baseline a user of transformers would reach for.
    """
    from xgrammar.contrib.hf import LogitsProcessor
    return LogitsProcessor([c.compiled for c in compiled])  # type: ignore[attr-defined]
