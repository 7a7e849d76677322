"""The vocabulary's single-character tokens, to read which characters a bitmask row allows
(the closing search's cursors, grammar/runtime/closing_search.py)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from grammar.runtime.closing_search import ALPHABET


class CharTokens:
    """The tokens that are exactly one ASCII character, for reading allowed characters off a bitmask."""

    def __init__(self, char_to_token_id: dict[str, int]) -> None:
        self.chars = list(char_to_token_id)
        self.token_ids = np.array([char_to_token_id[c] for c in self.chars], dtype=np.int64)
        self.token_id_of = dict(char_to_token_id)

    def allowed(self, bitmask_row: np.ndarray) -> str:
        """The characters whose token's bit is set in `bitmask_row` (uint32 words)."""
        ids = self.token_ids
        bits = (bitmask_row[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1
        return "".join(self.chars[i] for i in np.flatnonzero(bits))

    @classmethod
    def of_vocabulary(cls, encode: Callable[[str], list[int]], token_bytes: Sequence[bytes]) -> CharTokens:
        """The closing search's characters that the vocabulary has as tokens of their own
        (`encode`: the model tokenizer's plain encoding of a text)."""
        char_to_token_id = {}
        for char in ALPHABET:
            ids = encode(char)
            if len(ids) == 1 and ids[0] < len(token_bytes) and token_bytes[ids[0]] == char.encode():
                char_to_token_id[char] = ids[0]
        return cls(char_to_token_id)

