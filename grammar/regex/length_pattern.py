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
from grammar.regex.pieces import regex_pieces

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
    parsed = parse_regex(pattern)
    if parsed is None or len(parsed) != 1:
        return None, False
    sequence = parsed[0]
    anchored_start = int(bool(sequence) and sequence[0].anchor and sequence[0].text == "^")
    anchored_end = int(len(sequence) > anchored_start and sequence[-1].anchor and sequence[-1].text == "$")
    inner = sequence[anchored_start:len(sequence) - anchored_end]
    if not inner or any(not _single_character(a) for a in inner):
        return None, False
    atoms = [_Atom(a.text, a.low, a.high) for a in inner]
    if not anchored_start:
        atoms.insert(0, _Atom(".", 0, None, implicit=True))
    if not anchored_end:
        atoms.append(_Atom(".", 0, None, implicit=True))
    return atoms, bool(anchored_start and anchored_end)


def _single_character(atom: Atom) -> bool:
    """An atom that matches one character: a plain one, an escape of one, a class of plain members."""
    if atom.anchor or atom.alternatives or atom.text in _SPECIAL:
        return False
    if atom.text.startswith("["):  # nested class syntax is not modelled
        return not any(piece == "[" for _, piece, _ in regex_pieces(atom.text[1:-1]))
    letter = atom.escape
    return not letter or not (letter in _ANCHOR_ESCAPES or letter.isdigit() or atom.text in ("\\p", "\\P"))


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
