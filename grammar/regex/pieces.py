"""A regex's text read piece by piece, for the rules that rewrite or split patterns by hand."""
from __future__ import annotations

from collections.abc import Iterator


def regex_pieces(pattern: str) -> Iterator[tuple[int, str, bool]]:
    """(index, piece, in_class) for each piece of `pattern`: an escape (a backslash and the character
    after it) or one character, and whether it stands inside a [...] class ("[" counts as inside,
    the closing "]" as outside; a "]" right after "[" closes it, as these rules have always read it)."""
    i, in_class = 0, False
    while i < len(pattern):
        if pattern[i] == "\\":
            yield i, pattern[i:i + 2], in_class
            i += 2
            continue
        char = pattern[i]
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        yield i, char, in_class
        i += 1

