"""Turning text a grammar forces into the tokens the model's own tokenizer would produce.

A grammar often forces a run of text (`{"name":"` at the start of an object with a fixed first key).
Appending it without sampling saves forward passes, but only if the appended token ids are what
the model would have seen had the text been tokenized together with the rest of the output.
Two seams can break that:

* the head: the forced text may merge with the last output token (`"` then `name` is one token
  `"name` in some vocabularies). We check that tokenizing (last token's text + forced text) puts
  a token boundary exactly between them; if not, we force nothing this step.
* the tail: the text that follows (not known yet) may merge with the end of the forced text.
  Byte-level BPE never merges across pre-tokenizer chunks, and appending text can only change
  the *last* chunk, so we drop every token of the forced text's last chunk. When the grammar
  ends right after the forced text nothing can follow, and the tail is kept.

This module is tokenizer logic only; the matcher side lives in grammar/xgrammar/matcher.py.
"""
from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from transformers import PreTrainedTokenizerBase

    from grammar.backend import Grammar

# last tokens whose text and encoding are kept (a step's forced runs and closings mostly follow
# the same few: a quote, a colon, a comma)
_SEAM_CACHE_SIZE = 4096


class ForcedTextTokenizer:
    """Encodes forced text for one tokenizer. Stateless after construction but for a cache of
    seam tokens; thread-safe."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, *, enabled: bool = True) -> None:
        """`enabled=False` makes every method force nothing (tokenizers that prepend a space to
        each encoded text, SentencePiece style, cannot encode text in the middle of an output)."""
        self._tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._pre_tokenizer = getattr(backend, "pre_tokenizer", None)
        # the Rust tokenizer itself, where there is one: the same ids and text as the transformers
        # wrapper, which costs a few times as much per call (its decode may also clean up spaces:
        # then the wrapper decodes)
        self._fast = backend
        self._fast_decode = backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False)
        self._seam = lru_cache(maxsize=_SEAM_CACHE_SIZE)(self._seam_uncached)
        self.enabled = enabled

    def encode_after(self, context_ids: list[int], text: str) -> list[int]:
        """Token ids of `text`, or [] if they would not be the model's tokens after `context_ids`.

        Only the last context token is looked at: the ones before it are fixed already, and a
        merge across the seam needs the last token's text.
        """
        if not self.enabled or not text:
            return []
        ids = self._encode(text)
        if self._decode(ids) != text:  # a normalizer or special-token split changed it
            return []
        if context_ids:
            previous, previous_ids = self._seam(context_ids[-1])
            if "\ufffd" in previous:  # the last token ends inside a UTF-8 character
                return []
            if self._encode(previous + text) != previous_ids + ids:
                return []
        return ids

    def num_stable_tokens(self, text: str, ids: list[int]) -> int:
        """How many leading tokens of `ids` (the encoding of `text`) no following text can change."""
        if self._pre_tokenizer is None:
            return max(len(ids) - 1, 0)  # no chunk information: drop the last token, at least
        chunks = self._pre_tokenizer.pre_tokenize_str(text)
        if not chunks:
            return 0
        cut = chunks[-1][1][0]  # char offset where the last chunk starts
        head = self._encode(text[:cut]) if cut > 0 else []
        # the chunks before the last are tokenized on their own; verify rather than trust it
        return len(head) if ids[: len(head)] == head else 0

    def force(self, grammar: Grammar, context_ids: list[int], text: str) -> list[int]:
        """Accepts `text` (forced by `grammar` after `context_ids`) into `grammar` and returns the
        tokens it keeps: all of them when the grammar ends right after, else only the stable ones
        (the rest is rolled back and comes again, maybe merged with what follows). [] when the seam
        or the grammar refuses; the grammar is then as before."""
        ids = self.encode_after(context_ids, text)
        if not ids or not grammar.accept_tokens(ids):
            return []
        if grammar.is_terminated():
            return ids  # nothing can follow, so the last chunk cannot merge with anything
        num_stable = self.num_stable_tokens(text, ids)
        grammar.rollback(len(ids) - num_stable)
        return ids[:num_stable]

    def closing(self, grammar: Grammar, context_ids: list[int], text: str, stop_token_ids: list[int],
                max_tokens: int, check: Callable[[list[int]], bool] | None = None) -> list[int] | None:
        """The tokens of a closing `text` after `context_ids` (seam-checked, else plainly encoded),
        with a stop token after them where the output could go on; None if `check` or the grammar
        refuses them or they pass `max_tokens`. The grammar is left as it was."""
        ids = (self.encode_after(context_ids, text) or self.encode(text)) if text else []
        if (check is not None and not check(ids)) or not grammar.accept_tokens(ids):
            return None
        if not grammar.is_terminated():  # the output may go on: end it with a stop token
            stop = next((t for t in stop_token_ids if grammar.accept_tokens([t])), None)
            if stop is None:
                grammar.rollback(len(ids))
                return None
            ids = ids + [stop]
        grammar.rollback(len(ids))
        return ids if len(ids) <= max_tokens else None

    def encode(self, text: str) -> list[int]:
        """The plain encoding of `text`, seams unchecked ([] when disabled)."""
        return self._encode(text) if self.enabled else []

    def _seam_uncached(self, token_id: int) -> tuple[str, list[int]]:
        """A last context token's text and that text's encoding."""
        previous = self._decode([token_id])
        return previous, self._encode(previous)

    def _encode(self, text: str) -> list[int]:
        if self._fast is not None:
            return self._fast.encode(text, add_special_tokens=False).ids
        return self._tokenizer.encode(text, add_special_tokens=False)

    def _decode(self, ids: list[int]) -> str:
        if self._fast_decode:
            return self._fast.decode(ids, skip_special_tokens=False)
        return self._tokenizer.decode(ids)
