"""A regex's text read piece by piece, for rules that rewrite a pattern character by character or
read text that is not a whole pattern (a class's members). A rule about the pattern's structure
(groups, alternatives, anchors) walks the parsed form (grammar/regex/parsed.py) instead; where the
two readings differ is pinned by tests/grammar/test_regex_lexers_agree.py."""
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

