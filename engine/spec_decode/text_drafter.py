"""Drafts from the prompt's text: what followed, in the prompt, the text the output ends with.

Token lookup (engine/spec_decode/ngram_drafter.py) misses a copied span whose tokens differ from the
prompt's: `"Ann Lee"` in the output is `"`, `Ann`, ` Lee` where the prompt had ` Ann`, ` Lee`, so
the output's `Ann` never occurs in the prompt's tokens. Text has no such seam: the output's last few
bytes are looked up in the prompt's bytes, and the prompt text after the match is tokenized as the
next tokens; a string value just begun (`"An`, too short for that) is looked up at the start of a
word. Only whole tokens whose bytes begin that text are kept: the encoding is checked against
the text's bytes (a normalizer may change it), its last token is dropped when the text was cut
short (it may be the start of a longer word), and a text that starts or would end inside a UTF-8
character is trimmed to whole characters.

The prompt's bytes are joined once per request (the speculator keeps them in the request's
DraftState); a step reads only the last few output tokens, one
or two `bytes.find` calls per match length, and one encoding of a few dozen bytes.
"""
from __future__ import annotations

import bisect
import itertools
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

_TAIL_TOKENS = 12  # output tokens whose bytes are looked up: more than the longest match needs


class PromptText:
    """A prompt's bytes and where each of its tokens ends in them."""

    __slots__ = ("data", "token_ends")

    def __init__(self, data: bytes, token_ends: Sequence[int]) -> None:
        self.data = data
        self.token_ends = token_ends  # token i's bytes are data[token_ends[i - 1]:token_ends[i]]

    @classmethod
    def of(cls, token_ids: Sequence[int], token_bytes: Sequence[bytes]) -> PromptText:
        num_vocab = len(token_bytes)
        pieces = [token_bytes[t] if 0 <= t < num_vocab else b"" for t in token_ids]
        return cls(b"".join(pieces), array("q", itertools.accumulate(map(len, pieces))))

    def byte_end(self, num_tokens: int) -> int:
        """Where the prompt's first `num_tokens` tokens end in its bytes."""
        return self.token_ends[num_tokens - 1] if num_tokens > 0 else 0

    def num_tokens_within(self, num_bytes: int) -> int:
        """How many of the prompt's first tokens lie wholly within its first `num_bytes` bytes."""
        return bisect.bisect_right(self.token_ends, num_bytes)


@dataclass(frozen=True)
class TextMatch:
    """Where the prompt text the output ends with occurs: the draft is read from `begin` on."""

    num_bytes: int  # bytes of the output's end that matched
    begin: int  # byte offset in the prompt text just after the match


class TextDrafter:
    """One per engine: the vocabulary's bytes and the tokenizer's plain encoding of a text.

    `token_bytes[i]`: the bytes token i stands for; `encode(text)`: its tokens, no special tokens
    added. Stateless: a request's prompt text is built by `prompt_text` and kept by the caller."""

    def __init__(self, token_bytes: Sequence[bytes], encode: Callable[[str], list[int]],
                 min_match_bytes: int, max_match_bytes: int, bytes_per_draft_token: int = 8) -> None:
        self.token_bytes = token_bytes
        self.encode = encode
        self.min_match_bytes = min_match_bytes
        self.max_match_bytes = max_match_bytes
        self.bytes_per_draft_token = bytes_per_draft_token  # how much text a draft token is given

    def prompt_text(self, prompt_token_ids: Sequence[int]) -> PromptText:
        """A prompt as bytes (joined anew: keep it)."""
        return PromptText.of(prompt_token_ids, self.token_bytes)

    def output_tail(self, token_ids: Sequence[int], num_prompt_tokens: int) -> bytes:
        """The bytes of the output's last few tokens (never the prompt's): `token_ids` are the
        prompt's and the output's."""
        first = max(num_prompt_tokens, len(token_ids) - _TAIL_TOKENS)
        token_bytes = self.token_bytes
        num_vocab = len(token_bytes)
        return b"".join(token_bytes[t] for t in token_ids[first:] if 0 <= t < num_vocab)

    def find_continued(self, tail: bytes, prompt_text: PromptText, anchor: int, window: int) -> TextMatch | None:
        """The longest end of `tail` (the output's last bytes, `max_match_bytes` down to
        `min_match_bytes`) that occurs in the prompt ending within `window` bytes after `anchor`: the
        output goes on copying the text it copied up to `anchor`. None when it does not."""
        text = prompt_text.data
        end = min(anchor + window, len(text) - 1)  # an occurrence must be followed by at least one byte
        for num_bytes in range(min(self.max_match_bytes, len(tail)), self.min_match_bytes - 1, -1):
            at = text.find(tail[-num_bytes:], max(anchor - num_bytes, 0), end)
            if at >= 0:
                return TextMatch(num_bytes, at + num_bytes)
        return None

    def find(self, tail: bytes, prompt_text: PromptText, anchor: int = 0) -> TextMatch | None:
        """The longest end of `tail` (the output's last bytes, `max_match_bytes` down to `min_match_bytes`) that occurs
        in the prompt with text after it: its first occurrence ending at or after `anchor` (a
        byte offset: where the output last copied up to, extraction reads its text in order),
        else its last one. Shorter than that, the text of a JSON string begun at most
        `min_match_bytes - 1` bytes ago (`"Ka`) is looked up at the start of a word: a copied span
        is a value in the output and a word in the prompt. None when nothing matches."""
        text = prompt_text.data
        for num_bytes in range(min(self.max_match_bytes, len(tail)), self.min_match_bytes - 1, -1):
            begin = _find_ending_after(text, tail[-num_bytes:], anchor)
            if begin >= 0:
                return TextMatch(num_bytes, begin)
        quote = tail.rfind(b'"', max(len(tail) - self.min_match_bytes, 0))
        word = tail[quote + 1:] if quote >= 0 else b""
        if word and word.isalnum():
            begin = _find_ending_after(text, word, anchor, word_start=True)
            if begin >= 0:
                return TextMatch(len(word), begin)
        return None

    def draft_at(self, prompt_text: PromptText, begin: int, max_tokens: int) -> tuple[list[int], list[int]]:
        """(tokens, their byte ends): up to `max_tokens` whole tokens of the prompt text from byte
        `begin` on, and where each ends in that text (offsets from `begin`)."""
        text = prompt_text.data
        end = min(begin + max_tokens * self.bytes_per_draft_token, len(text))
        token_ids = self.encode_continuation(text[begin:end], cut_short=end < len(text))
        ends = []
        num_bytes = 0
        token_bytes = self.token_bytes
        for token_id in token_ids[:max_tokens]:
            num_bytes += len(token_bytes[token_id])
            ends.append(num_bytes)
        return token_ids[:max_tokens], ends

    def encode_continuation(self, data: bytes, cut_short: bool) -> list[int]:
        """Whole tokens whose bytes, joined, begin `data`; `cut_short`: more text followed `data`,
        so its last token may be the head of a longer one and is dropped."""
        if not data or _is_continuation_byte(data[0]):
            return []  # the output ends inside a character: its rest is no text to encode
        num_whole = _whole_characters_length(data)
        if num_whole < len(data):
            data, cut_short = data[:num_whole], True
        if not data:
            return []
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:  # prompt ids that are no text (a client may send any ids)
            return []
        token_ids = self.encode(text)
        if cut_short:
            token_ids = token_ids[:-1]
        token_bytes = self.token_bytes
        num_vocab = len(token_bytes)
        at = 0
        for i, token_id in enumerate(token_ids):
            piece = token_bytes[token_id] if 0 <= token_id < num_vocab else b""
            if not piece or not data.startswith(piece, at):
                return token_ids[:i]  # the encoding changed the text here (a normalizer, a special token)
            at += len(piece)
        return token_ids


def _find_ending_after(text: bytes, pattern: bytes, anchor: int, word_start: bool = False) -> int:
    """Where the text after an occurrence of `pattern` in `text` begins: the first occurrence
    that ends at or after `anchor`, else the last one; only occurrences with text after them and
    (`word_start`) not preceded by a letter or digit. -1 when there is none."""
    num_bytes = len(pattern)
    last = len(text) - 1  # an occurrence must be followed by at least one byte
    at = text.find(pattern, max(anchor - num_bytes, 0), last)
    while at >= 0 and word_start and at > 0 and text[at - 1:at].isalnum():
        at = text.find(pattern, at + 1, last)
    if at >= 0:
        return at + num_bytes
    at = text.rfind(pattern, 0, last)
    while at >= 0 and word_start and at > 0 and text[at - 1:at].isalnum():
        at = text.rfind(pattern, 0, at + num_bytes - 1)
    return at + num_bytes if at >= 0 else -1


def _is_continuation_byte(byte: int) -> bool:
    return 0x80 <= byte < 0xC0


def _whole_characters_length(data: bytes) -> int:
    """The length of the longest head of `data` that does not end inside a UTF-8 character."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return len(data)  # ASCII: complete
        if byte >= 0xC0:  # a lead byte: its character needs this many bytes
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) if back >= need else len(data) - back
    return len(data)  # no lead byte within reach: not UTF-8 the encoder can fix; leave it to the check
