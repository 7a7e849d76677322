"""Counted quantifiers over a limit: a count a regex engine reading 32-bit integers would wrap."""
from __future__ import annotations

import re

# a counted quantifier: {m}, {m,} or {m,n}
_QUANTIFIER = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def find_large_repeat(pattern: str, max_count: int) -> tuple[str, int] | None:
    """(count, character offset) of the first counted quantifier in a regex whose count is over
    `max_count`, or None. Escapes and character classes are skipped (a "{" there is literal).

    xgrammar reads counts as 32-bit integers, so `a{4294967297}` would silently mean `a{1}`.
    Lexical on purpose, not on the parsed form: it also guards backends whose own regex readers
    accept more than ECMA-262 (a count with spaces, an inline flag).
    """
    index, in_class = 0, False
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            index += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            if pattern.startswith("]", index + 1):  # a leading "]" is literal inside a class
                index += 1
            elif pattern.startswith("^]", index + 1):
                index += 2
        elif char == "{":
            match = _QUANTIFIER.match(pattern, index)
            if match:
                for group in match.groups():
                    # compare digit counts first: int() refuses strings of thousands of digits
                    digits = group.lstrip("0") if group else ""
                    if digits and (len(digits) > len(str(max_count)) or int(digits) > max_count):
                        return (digits if len(digits) <= 24 else digits[:24] + "..."), index
                index = match.end()
                continue
        index += 1
    return None
