"""A regex's text read piece by piece, for the rules that rewrite or split patterns by hand, and
its quantifiers."""
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


def quantifier(pattern: str, i: int, end: int) -> tuple[int, int | None, int]:
    """(low, high, the index after it) of the quantifier at i (1, 1 where there is none; a lazy or
    possessive one matches the same full strings); low -1: unreadable."""
    if i >= end:
        return 1, 1, i
    char = pattern[i]
    if char in "*+?":
        low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[char]
        i += 1
    elif char == "{":
        close = pattern.find("}", i)
        if close < 0 or close >= end:
            return -1, None, i
        body = pattern[i + 1:close]
        parts = body.split(",")
        try:
            if len(parts) == 1:
                low = high = int(parts[0])
            elif len(parts) == 2:
                low = int(parts[0]) if parts[0] else 0
                high = int(parts[1]) if parts[1] else None
            else:
                return -1, None, i
        except ValueError:
            return -1, None, i
        i = close + 1
    else:
        return 1, 1, i
    if i < end and pattern[i] in "?+":
        i += 1  # lazy / possessive: the same set of full matches
    if i < end and pattern[i] in "*+?{":
        return -1, None, i
    return low, high, i
