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
from grammar.regex.parsed import Atom, lengths, parse_regex, walk
from grammar.regex.pieces import quantifier

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
    parsed = parse_regex(pattern)
    if parsed is None:
        return None
    lows, highs = [], []
    for alternative in parsed:
        if len(alternative) < 2 or alternative[0].text != "^" or alternative[-1].text != "$" or \
                not alternative[0].anchor or not alternative[-1].anchor:
            return None
        inner = alternative[1:-1]
        if any(atom.anchor or _not_modelled(atom) for atom in walk(inner)):
            return None
        low, high = lengths(inner)
        lows.append(low)
        highs.append(high)
    return min(lows), (None if any(h is None for h in highs) else max(highs))  # type: ignore[type-var]


def _not_modelled(atom: Atom) -> bool:
    """An escape whose length is not read here: a position, a back-reference, a property, a code."""
    letter = atom.escape
    return bool(letter) and (letter in _ANCHOR_ESCAPES or letter.isdigit() or letter in "pPux")
