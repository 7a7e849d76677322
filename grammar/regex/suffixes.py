"""The shortest ways to finish a regular expression, from every point inside it.

The closing search (grammar/runtime/closing_search.py) writes one character at a time and cannot guess a
word: under `\\w+/(\\w+\\.)*\\w+\\.dll` (a library's path) every letter keeps the output inside
a `\\w+`, and the way out needs the four characters `.dll` in that order. Here the pattern itself
is read: for each point of it (before or after an element, inside a repeat with so many turns
left) the shortest text that takes it to the end, built from the shortest match of each element
still ahead. The shortest completion from wherever an output stands inside the pattern is one of
these, so the search tries them (the matcher says which fit) before it goes round a loop.

Parsed with Python's own regex parser (`re._parser`): JSON-Schema patterns and Formwork's regex
constraints use the common subset of regex syntax, and a pattern it cannot read (or with
back-references or lookaround) simply gives no suffixes. Library-free.
"""
from __future__ import annotations

import re

try:  # the parser behind `re` (Python 3.11+), with its opcodes
    from re import _constants as sre
    from re import _parser as sre_parse
except ImportError:  # pragma: no cover - an interpreter without it gets no suffixes
    sre = sre_parse = None

MAX_SUFFIXES = 64  # per pattern, shortest first
MAX_SUFFIX_CHARS = 256  # a longer way out is left to the character search
_MAX_COUNTED_REPEAT = 64  # {m} with a larger m: too many distinct suffixes to list
# the character that stands for a class, in order of preference: plain text first
_REPRESENTATIVES = "a0 _-.A1:/@" + "".join(chr(c) for c in range(0x21, 0x7F))


class _Unsupported(Exception):
    """An element whose shortest match cannot be built from the pattern alone."""


def regex_suffixes(pattern: str) -> list[str]:
    """The distinct shortest completions of `pattern` from each point inside it, shortest first
    (the empty one, "already at the end", left out); [] if the pattern is not understood."""
    if sre_parse is None:
        return []
    try:
        parsed = sre_parse.parse(pattern)
        suffixes = _suffixes(list(parsed))
    except (_Unsupported, re.error, RecursionError, OverflowError, ValueError, TypeError):
        return []
    return sorted((s for s in suffixes if s), key=lambda s: (len(s), s))[:MAX_SUFFIXES]


def _witness(items: list) -> str:
    """The shortest text the parsed items match."""
    return "".join(_item_witness(op, arg) for op, arg in items)


def _suffixes(items: list) -> set[str]:
    """Completions from every point of a sequence: from inside element i, that element's own
    completions followed by the shortest match of everything after it."""
    out = {""}
    tail = ""
    for op, arg in reversed(items):
        out |= _bounded({s + tail for s in _item_suffixes(op, arg)})
        tail = _item_witness(op, arg) + tail
        if len(tail) > MAX_SUFFIX_CHARS:
            raise _Unsupported("too long")
    return _bounded(out)


def _bounded(suffixes: set[str]) -> set[str]:
    kept = {s for s in suffixes if len(s) <= MAX_SUFFIX_CHARS}
    if len(kept) > 4 * MAX_SUFFIXES:
        kept = set(sorted(kept, key=lambda s: (len(s), s))[:4 * MAX_SUFFIXES])
    return kept


def _item_witness(op, arg) -> str:
    if op in (sre.LITERAL, sre.NOT_LITERAL, sre.IN, sre.ANY):
        return _one_char(op, arg)
    if op is sre.AT:
        return ""
    if op is sre.SUBPATTERN:
        return _witness(list(arg[-1]))
    if op is sre.ATOMIC_GROUP:
        return _witness(list(arg))
    if op is sre.BRANCH:
        return min((_witness(list(alt)) for alt in arg[1]), key=len)
    if op in _REPEATS:
        low, _, body = arg
        if low > _MAX_COUNTED_REPEAT:
            raise _Unsupported("counted repeat")
        return _witness(list(body)) * low
    raise _Unsupported(str(op))  # back-references, lookaround, conditionals


def _item_suffixes(op, arg) -> set[str]:
    if op in (sre.LITERAL, sre.NOT_LITERAL, sre.IN, sre.ANY):
        return {_one_char(op, arg), ""}
    if op is sre.AT:
        return {""}
    if op is sre.SUBPATTERN:
        return _suffixes(list(arg[-1]))
    if op is sre.ATOMIC_GROUP:
        return _suffixes(list(arg))
    if op is sre.BRANCH:
        return _bounded(set().union(*(_suffixes(list(alt)) for alt in arg[1])))
    if op in _REPEATS:
        low, _, body = arg
        items = list(body)
        once = _witness(items)
        inside = _suffixes(items)
        # inside one turn with `left` more turns still required (0 once the minimum is met),
        # or before the repeat (all `low` turns ahead)
        out = {s + once * left for s in inside for left in range(low)} | inside | {once * low}
        return _bounded(out)
    raise _Unsupported(str(op))


_REPEATS = tuple(getattr(sre, name) for name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")
                 if sre is not None and hasattr(sre, name))


def _one_char(op, arg) -> str:
    """A character the element matches, plain text preferred."""
    if op is sre.LITERAL:
        return chr(arg)
    if op is sre.NOT_LITERAL:
        return next(c for c in _REPRESENTATIVES if ord(c) != arg)
    if op is sre.ANY:
        return _REPRESENTATIVES[0]
    for char in _REPRESENTATIVES:
        if _in_class(char, arg):
            return char
    raise _Unsupported("no plain character in the class")


def _in_class(char: str, items: list) -> bool:
    negated = bool(items) and items[0][0] is sre.NEGATE
    code = ord(char)
    found = False
    for op, arg in items[1:] if negated else items:
        if op is sre.LITERAL:
            found = code == arg
        elif op is sre.RANGE:
            found = arg[0] <= code <= arg[1]
        elif op is sre.CATEGORY:
            found = _in_category(char, arg)
        else:
            raise _Unsupported(str(op))
        if found:
            break
    return found != negated


def _in_category(char: str, category) -> bool:
    word = char.isalnum() or char == "_"
    tests = {sre.CATEGORY_DIGIT: char.isdigit(), sre.CATEGORY_NOT_DIGIT: not char.isdigit(),
             sre.CATEGORY_SPACE: char.isspace(), sre.CATEGORY_NOT_SPACE: not char.isspace(),
             sre.CATEGORY_WORD: word, sre.CATEGORY_NOT_WORD: not word}
    if category not in tests:
        raise _Unsupported(str(category))
    return tests[category]
