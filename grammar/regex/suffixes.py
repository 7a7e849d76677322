"""The shortest ways to finish a regular expression, from every point inside it.

The closing search (grammar/runtime/closing_search.py) writes one character at a time and cannot guess a
word: under `\\w+/(\\w+\\.)*\\w+\\.dll` (a library's path) every letter keeps the output inside
a `\\w+`, and the way out needs the four characters `.dll` in that order. Here the pattern itself
is read: for each point of it (before or after an element, inside a repeat with so many turns
left) the shortest text that takes it to the end, built from the shortest match of each element
still ahead. The shortest completion from wherever an output stands inside the pattern is one of
these, so the search tries them (the matcher says which fit) before it goes round a loop.

Read from the pattern's parsed form (grammar/regex/parsed.py, ECMA-262 syntax): a pattern it
refuses, or one with back-references or a class with no plain character, simply gives no
suffixes. Library-free.
"""
from __future__ import annotations

from grammar.regex.characters import CLASS_ESCAPES, class_members, escaped_char, in_class_escape
from grammar.regex.parsed import ZERO_WIDTH_ESCAPES, Atom, parse_regex

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
    parsed = parse_regex(pattern)
    if parsed is None:
        return []
    try:
        suffixes = _bounded(set().union(*(_suffixes(alternative) for alternative in parsed)))
    except (_Unsupported, ValueError, RecursionError):
        return []
    return sorted((s for s in suffixes if s), key=lambda s: (len(s), s))[:MAX_SUFFIXES]


def _witness(sequence: list[Atom]) -> str:
    """The shortest text the sequence matches."""
    return "".join(_atom_witness(atom) for atom in sequence)


def _suffixes(sequence: list[Atom]) -> set[str]:
    """Completions from every point of a sequence: from inside atom i, that atom's own
    completions followed by the shortest match of everything after it."""
    out = {""}
    tail = ""
    for atom in reversed(sequence):
        out |= _bounded({s + tail for s in _atom_suffixes(atom)})
        tail = _atom_witness(atom) + tail
        if len(tail) > MAX_SUFFIX_CHARS:
            raise _Unsupported("too long")
    return _bounded(out)


def _bounded(suffixes: set[str]) -> set[str]:
    kept = {s for s in suffixes if len(s) <= MAX_SUFFIX_CHARS}
    if len(kept) > 4 * MAX_SUFFIXES:
        kept = set(sorted(kept, key=lambda s: (len(s), s))[:4 * MAX_SUFFIXES])
    return kept


def _atom_witness(atom: Atom) -> str:
    if atom.low > _MAX_COUNTED_REPEAT:
        raise _Unsupported("counted repeat")
    return _body_witness(atom) * atom.low


def _body_witness(atom: Atom) -> str:
    """The shortest text one turn of the atom matches."""
    if atom.anchor:
        return ""
    if atom.alternatives:
        return min((_witness(alternative) for alternative in atom.alternatives), key=len)
    return _one_char(atom)


def _body_suffixes(atom: Atom) -> set[str]:
    """Completions from every point inside one turn of the atom."""
    if atom.anchor:
        return {""}
    if atom.alternatives:
        return _bounded(set().union(*(_suffixes(alternative) for alternative in atom.alternatives)))
    return {_one_char(atom), ""}


def _atom_suffixes(atom: Atom) -> set[str]:
    inside = _body_suffixes(atom)
    if (atom.low, atom.high) == (1, 1):
        return inside
    low = atom.low
    if low > _MAX_COUNTED_REPEAT:  # before the turns are listed: a{100000} would fill memory
        raise _Unsupported("counted repeat")
    once = _body_witness(atom)
    # inside one turn with `left` more turns still required (0 once the minimum is met),
    # or before the repeat (all `low` turns ahead)
    out = {s + once * left for s in inside for left in range(low)} | inside | {once * low}
    return _bounded(out)


def _one_char(atom: Atom) -> str:
    """A character the unit matches, plain text preferred ("" for a position such as \\b)."""
    text, letter = atom.text, atom.escape
    if text == ".":
        return _REPRESENTATIVES[0]
    if text.startswith("["):
        return _class_char(text)
    if not letter:
        return text
    if letter in ZERO_WIDTH_ESCAPES:
        return ""
    if letter in CLASS_ESCAPES:
        return next(c for c in _REPRESENTATIVES if in_class_escape(c, letter))
    if letter.isdigit() and letter != "0" or letter in "pPkc":
        raise _Unsupported("back-reference, property or control escape")
    char = escaped_char(text)
    if char is None:
        raise _Unsupported("incomplete escape")
    return char


def _class_char(text: str) -> str:
    negated, members = class_members(text, text)
    for char in _REPRESENTATIVES:
        if any(member.contains(char) for member in members) != negated:
            return char
    raise _Unsupported("no plain character in the class")
