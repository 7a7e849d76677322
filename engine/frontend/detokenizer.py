r"""Incremental detokenization of one request's output, with stop strings.

Decoding each new token alone is wrong: byte-level tokens can end in the middle of a UTF-8
character, and SentencePiece-style decoders change a token's text depending on its neighbours.
Decoding the whole output every step is right but quadratic. So, as vLLM does, we keep two offsets
into the output ids:

    ids:  ... | prefix_offset ...... read_offset ...... end |
                \___ already emitted ___/ \__ new ___/

and decode only the window `ids[prefix_offset:]`. Its text minus the text of
`ids[prefix_offset:read_offset]` is the new text. When the window's text ends in U+FFFD the last
character is incomplete: nothing is emitted and the offsets stay, so the bytes are held until a
later token completes the character. `finish()` releases whatever is still held.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.frontend.tokenizer import Tokenizer

_REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Text of one request's output tokens, fed a few tokens per step.

    Invariants:
    * `output_text` equals `tokenizer.decode(ids, skip_special_tokens)` of the ids fed so far, minus
      a trailing incomplete character, cut at the first stop string (after it with
      `include_stop_str_in_output`); after `finish()` nothing is held back.
    * `get_delta()` pieces concatenate to a prefix of `output_text`; while streaming they hold back
      a suffix that could still grow into a stop string.
    * Once a stop string matched, further tokens are ignored.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        skip_special_tokens: bool = True,
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
        min_tokens: int = 0,
    ) -> None:
        self._decode_ids = tokenizer.backend.decode
        self.skip_special_tokens = skip_special_tokens
        self.stop = tuple(s for s in stop if s)
        self.include_stop_str_in_output = include_stop_str_in_output
        self._max_stop_len = max((len(s) for s in self.stop), default=0)
        self.min_tokens = min_tokens  # stop strings are looked for from this many tokens on

        self.token_ids: list[int] = []  # every id fed (the window source)
        self.output_text = ""
        self.stop_str: str | None = None  # the stop string that matched
        self.finished = False  # a stop string matched or finish() was called
        self._prefix_offset = 0
        self._read_offset = 0
        self._prefix_text: str | None = ""  # text of ids[prefix_offset:read_offset]; None: not decoded yet
        self._num_emitted_chars = 0  # chars of output_text handed out by get_delta()

    # ---- feeding ------------------------------------------------------------------------------

    def update(self, new_token_ids: Sequence[int]) -> int:
        """Decode `new_token_ids`; return how many of them were consumed.

        All of them, unless a stop string matched: then the count ends at the token that completed
        it, the text is cut there, and the request is finished (later calls consume nothing).
        """
        if self.finished or not new_token_ids:
            return 0
        if not self.stop:
            self.token_ids.extend(new_token_ids)
            self._decode_window(len(new_token_ids))
            return len(new_token_ids)
        # one token at a time, so we know which token completed a stop string
        for num_consumed, token_id in enumerate(new_token_ids, start=1):
            self.token_ids.append(token_id)
            num_chars_before = len(self.output_text)
            self._decode_window()
            if (len(self.output_text) > num_chars_before and len(self.token_ids) >= self.min_tokens
                    and self._match_stop(num_chars_before)):
                return num_consumed
        return len(new_token_ids)

    def finish(self) -> None:
        """The request ended: release held-back bytes (as U+FFFD if still incomplete) and any
        partial stop-string prefix. Idempotent."""
        if self.finished:
            return
        if self._read_offset < len(self.token_ids):
            prefix_text = self._window_prefix_text()
            new_text = self._decode(self.token_ids[self._prefix_offset:])
            if len(new_text) > len(prefix_text):
                num_chars_before = len(self.output_text)
                self.output_text += new_text[len(prefix_text):]
                self._read_offset = len(self.token_ids)
                if self.stop and len(self.token_ids) >= self.min_tokens:
                    self._match_stop(num_chars_before)
        self.finished = True

    # ---- reading ------------------------------------------------------------------------------

    def get_delta(self) -> str:
        """Text not handed out before. Until finished, a suffix that is a proper prefix of a stop
        string is held back (at most longest stop string - 1 chars) and released later if it turns
        out not to be one."""
        end = len(self.output_text)
        if self.stop and not self.finished:
            end -= _partial_stop_len(self.output_text, self.stop, self._num_emitted_chars)
        if end <= self._num_emitted_chars:
            return ""
        delta = self.output_text[self._num_emitted_chars:end]
        self._num_emitted_chars = end
        return delta

    @property
    def emitted_text(self) -> str:
        """Concatenation of every `get_delta()` so far."""
        return self.output_text[:self._num_emitted_chars]

    # ---- internals ----------------------------------------------------------------------------

    def _decode(self, token_ids: list[int]) -> str:
        return self._decode_ids(token_ids, skip_special_tokens=self.skip_special_tokens)

    def _window_prefix_text(self) -> str:
        if self._prefix_text is None:
            self._prefix_text = self._decode(self.token_ids[self._prefix_offset:self._read_offset])
        return self._prefix_text

    def _decode_window(self, num_new_tokens: int = 1) -> None:
        ids = self.token_ids
        prefix_text = self._window_prefix_text()
        # try the whole window first; if it ends inside a character, drop the newest tokens one by
        # one (at most num_new_tokens - 1) so complete text before that character is not held back
        for end in range(len(ids), len(ids) - num_new_tokens, -1):
            new_text = self._decode(ids[self._prefix_offset:end])
            if not new_text.endswith(_REPLACEMENT_CHAR):
                break
        else:
            return  # still inside a character: hold the bytes
        if len(new_text) <= len(prefix_text):
            return  # no new text (e.g. skipped special tokens): keep the window
        self.output_text += new_text[len(prefix_text):]
        self._prefix_offset = self._read_offset
        self._read_offset = end
        self._prefix_text = None  # decoded when next needed

    def _match_stop(self, num_chars_before: int) -> bool:
        """Look for a stop string ending in the text added after `num_chars_before` chars; on a
        match cut the text, remember the string and finish. The earliest match wins (ties: the
        first stop string listed)."""
        text = self.output_text
        best_index, best_stop = -1, ""
        for stop in self.stop:
            # a match must end in the new text, so it starts at most len(stop) - 1 chars before it
            index = text.find(stop, max(num_chars_before - len(stop) + 1, 0))
            if index != -1 and (best_index == -1 or index < best_index):
                best_index, best_stop = index, stop
        if best_index == -1:
            return False
        end = best_index + len(best_stop) if self.include_stop_str_in_output else best_index
        # held-back text never contains a whole stop string, so the cut is never before emitted text
        self.output_text = text[:max(end, self._num_emitted_chars)]
        self.stop_str = best_stop
        self.finished = True
        return True


def _partial_stop_len(text: str, stops: Sequence[str], start: int) -> int:
    """Length of the longest suffix of `text[start:]` that is a proper prefix of one of `stops`."""
    n = len(text)
    best = 0
    for stop in stops:
        first = stop[0]
        i = text.find(first, max(n - len(stop) + 1, start))
        # the earliest candidate is the longest; stop once candidates cannot beat `best`
        while i != -1 and n - i > best:
            if stop.startswith(text[i:]):
                best = n - i
                break
            i = text.find(first, i + 1)
    return best
