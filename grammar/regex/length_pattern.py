"""Fold minLength/maxLength into a simple `pattern`, so one regex carries both.

xgrammar ignores length bounds beside a pattern. A pattern that is a sequence of single-character
atoms (`[a-z]`, `\\d`, `.`, `x`), each with a quantifier, has a length that is the sum of the
atoms' counts, so the bounds can be written into the quantifiers. With one variable atom this is
exact; with several, the slack goes to the widest one and the others are capped (narrowing).
An unanchored end matches anything there, so it is read as `.*` (narrowing a little: `.` does
not match a line break), and the result is anchored (`^...$`). A pattern with groups or
alternation is kept when every match already has an allowed length (the bounds are then
dropped: exact), else its repeats are capped (grammar/regex/length_caps.py: narrowing); anything else
(lookaround, backreferences) is left alone.
"""
from __future__ import annotations

from dataclasses import dataclass

from grammar.regex.length_caps import cap_lengths
from grammar.regex.pieces import quantifier, regex_pieces

_SPECIAL = set("()|*+?{}^$[]")
_ANCHOR_ESCAPES = set("bBAzZG")


@dataclass
class _Atom:
    text: str
    low: int
    high: int | None  # None: unbounded
    implicit: bool = False  # the ".*" an unanchored end stands for


def fold_lengths(pattern: str, min_length: int, max_length: int | None) -> tuple[str, bool] | None:
    """(the new pattern, whether it is narrower than pattern + bounds), or None if it cannot be folded."""
    if min_length <= 0 and max_length is None:
        return pattern, False  # no bound at all
    implied = implied_lengths(pattern)
    if implied is not None and implied[0] >= min_length and (
            max_length is None or (implied[1] is not None and implied[1] <= max_length)):
        return pattern, False  # every match already has an allowed length: the bounds add nothing
    atoms, anchored = _parse(pattern)
    if atoms is None:
        return cap_lengths(pattern, min_length, max_length)
    fixed_low = sum(a.low for a in atoms)
    fixed_high = None if any(a.high is None for a in atoms) else sum(a.high for a in atoms)  # type: ignore[misc]
    narrowed = not anchored
    if fixed_low >= min_length and (max_length is None or (fixed_high is not None and fixed_high <= max_length)):
        return _render(atoms), narrowed  # the pattern already implies the bounds
    variable = [a for a in atoms if a.high is None or a.high > a.low]
    if not variable:
        return None  # a fixed length outside the bounds: leave it for the checker
    explicit = [a for a in variable if not a.implicit] or variable
    slack = max(explicit, key=lambda a: float("inf") if a.high is None else a.high - a.low)
    others = [a for a in atoms if a is not slack]
    for atom in others:
        if atom.implicit:
            atom.high = 0  # the pattern's own atom carries the bounds: anchor this end
        elif max_length is not None and atom.high is None:
            atom.high = atom.low  # capped so that the total has an upper bound
            narrowed = True
    others_low = sum(a.low for a in others)
    low = max(slack.low, min_length - others_low)
    high = slack.high
    if max_length is not None:
        others_high = sum(a.high for a in others)  # type: ignore[misc]
        high = max_length - others_high if high is None else min(high, max_length - others_high)
    if high is not None and high < low:
        return None
    if len([a for a in variable if not a.implicit]) > 1:
        narrowed = True  # the slack atom alone carries the bounds, whatever the others match
    slack.low, slack.high = low, high
    return _render(atoms), narrowed


def _parse(pattern: str) -> tuple[list[_Atom] | None, bool]:
    """The atoms of `pattern` and whether it is anchored at both ends; (None, _) if not simple."""
    start, end = 0, len(pattern)
    anchored_start = pattern.startswith("^")
    if anchored_start:
        start = 1
    anchored_end = pattern.endswith("$") and not pattern.endswith("\\$")
    if anchored_end:
        end -= 1
    atoms: list[_Atom] = []
    i = start
    while i < end:
        char = pattern[i]
        if char == "[":
            j = i + 1
            if j < end and pattern[j] == "^":
                j += 1
            if j < end and pattern[j] == "]":
                j += 1
            while j < end and pattern[j] != "]":
                if pattern[j] == "[":
                    return None, False  # nested class syntax: not modelled
                j += 2 if pattern[j] == "\\" else 1
            if j >= end:
                return None, False
            text, i = pattern[i:j + 1], j + 1
        elif char == "\\":
            if i + 1 >= end:
                return None, False
            nxt = pattern[i + 1]
            if nxt in _ANCHOR_ESCAPES or nxt.isdigit():
                return None, False
            width = {"u": 6, "x": 4}.get(nxt, 2)
            if nxt in "pP":
                close = pattern.find("}", i)
                if close < 0 or close >= end:
                    return None, False
                width = close - i + 1
            text, i = pattern[i:i + width], i + width
        elif char in _SPECIAL:
            return None, False
        else:
            text, i = char, i + 1
        low, high, i = quantifier(pattern, i, end)
        if low < 0:
            return None, False
        atoms.append(_Atom(text, low, high))
    if not atoms:
        return None, False
    if not anchored_start:
        atoms.insert(0, _Atom(".", 0, None, implicit=True))
    if not anchored_end:
        atoms.append(_Atom(".", 0, None, implicit=True))
    return atoms, anchored_start and anchored_end


def _render(atoms: list[_Atom]) -> str:
    out = []
    for atom in atoms:
        if atom.high == 0:
            continue
        if (atom.low, atom.high) == (1, 1):
            suffix = ""
        elif atom.high is None:
            suffix = {0: "*", 1: "+"}.get(atom.low, f"{{{atom.low},}}")
        elif atom.low == atom.high:
            suffix = f"{{{atom.low}}}"
        else:
            suffix = f"{{{atom.low},{atom.high}}}"
        out.append(atom.text + suffix)
    return "^" + "".join(out) + "$"


def implied_lengths(pattern: str) -> tuple[int, int | None] | None:
    """(shortest, longest or None) length of the strings a pattern anchored at both ends (each
    top-level alternative `^...$`) matches; None for anything else or any construct not modelled
    (lookaround, backreferences, anchors inside)."""
    if "[]" in pattern or "[^]" in pattern:
        return None  # ECMA-262 and Python read these classes differently
    alternatives = _split_top(pattern)
    if alternatives is None:
        return None
    lows, highs = [], []
    for alternative in alternatives:
        if not (alternative.startswith("^") and alternative.endswith("$") and not alternative.endswith("\\$")):
            return None
        parsed = _lengths(alternative, 1, len(alternative) - 1)
        if parsed is None:
            return None
        lows.append(parsed[0])
        highs.append(parsed[1])
    return min(lows), (None if any(h is None for h in highs) else max(highs))  # type: ignore[type-var]


def _split_top(pattern: str) -> list[str] | None:
    """`pattern` split at its top-level "|"s (outside groups and classes)."""
    parts, depth, start, in_class = [], 0, 0, False
    for i, piece, in_class in regex_pieces(pattern):
        if in_class:
            continue
        if piece == "(":
            depth += 1
        elif piece == ")":
            depth -= 1
        elif piece == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
    return None if depth or in_class else [*parts, pattern[start:]]


def _lengths(pattern: str, start: int, end: int) -> tuple[int, int | None] | None:
    """(min, max) length of pattern[start:end], a sequence that may hold groups and "|"."""
    alternatives = _split_top(pattern[start:end])
    if alternatives is None:
        return None
    if len(alternatives) > 1:
        parts = [_lengths(a, 0, len(a)) for a in alternatives]
        if any(p is None for p in parts):
            return None
        highs = [p[1] for p in parts]  # type: ignore[index]
        return min(p[0] for p in parts), (None if None in highs else max(highs))  # type: ignore[index, type-var]
    low, high, i = 0, 0, start
    while i < end:
        char = pattern[i]
        if char == "(":
            if pattern.startswith("(?", i) and not pattern.startswith("(?:", i):
                return None  # lookaround, named groups, flags
            close = _closing(pattern, i, end)
            if close is None:
                return None
            inner = _lengths(pattern, i + (3 if pattern.startswith("(?:", i) else 1), close)
            if inner is None:
                return None
            atom_low, atom_high, i = inner[0], inner[1], close + 1
        elif char == "[":
            j = i + 1 + (pattern[i + 1:i + 2] == "^")
            j += pattern[j:j + 1] == "]"
            while j < end and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            if j >= end:
                return None
            atom_low, atom_high, i = 1, 1, j + 1
        elif char == "\\":
            if i + 1 >= end or pattern[i + 1] in _ANCHOR_ESCAPES or pattern[i + 1].isdigit() or pattern[i + 1] in "pPux":
                return None
            atom_low, atom_high, i = 1, 1, i + 2
        elif char in "^$|)*+?{}":
            return None
        else:
            atom_low, atom_high, i = 1, 1, i + 1
        q_low, q_high, i = quantifier(pattern, i, end)
        if q_low < 0:
            return None
        low += atom_low * q_low
        if high is not None:
            high = None if (q_high is None or atom_high is None) else high + atom_high * q_high
    return low, high


def _closing(pattern: str, i: int, end: int) -> int | None:
    """The index of the ")" that closes the "(" at i."""
    depth, in_class = 0, False
    while i < end:
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None
