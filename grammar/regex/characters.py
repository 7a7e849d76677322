"""What a character unit of a parsed pattern (an escape, a [...] class) stands for.

The escapes read here are the ones every reader agrees on: control escapes (\\n \\t \\r \\f \\v
\\0 \\a), \\xHH, \\uHHHH, the class escapes \\d \\w \\s and their negations, and an escaped
punctuation or letter standing for itself. Which of the others (\\b, \\1, \\p{L}) a reader models is
its own choice.
"""
from __future__ import annotations

from dataclasses import dataclass

from grammar.regex.parsed import RegexSyntaxError

CLASS_ESCAPES = frozenset("dwsDWS")
_CONTROL_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0", "a": "\a"}


def escaped_char(escape: str) -> str | None:
    """The one character an escape as the parser delimits it stands for ("\\x41" -> "A", "\\." ->
    "."); None for \\x or \\u without their hex digits and for the class escapes."""
    letter = escape[1]
    if letter in CLASS_ESCAPES:
        return None
    if letter in _CONTROL_ESCAPES:
        return _CONTROL_ESCAPES[letter]
    if letter in "xu":
        return chr(int(escape[2:], 16)) if len(escape) > 2 else None
    return letter


def in_class_escape(char: str, letter: str) -> bool:
    """Whether `char` is in the class escape \\<letter> (d w s, or their negations D W S)."""
    lower = letter.lower()
    if lower == "d":
        found = char.isdigit()
    elif lower == "w":
        found = char.isalnum() or char == "_"
    else:
        found = char.isspace()
    return found != letter.isupper()


@dataclass(frozen=True)
class ClassMember:
    """One member of a [...] class: a range of characters (`low`..`high`), or a class escape."""

    low: str = ""
    high: str = ""
    escape: str = ""  # "d" for \d: the whole class escape

    def contains(self, char: str) -> bool:
        return in_class_escape(char, self.escape) if self.escape else self.low <= char <= self.high


def class_members(pattern: str, text: str, position: int = 0) -> tuple[bool, list[ClassMember]]:
    """(negated, members) of the class `text` ("[...]" as the parser delimited it, at `position`
    of `pattern`). Inside a class \\b is a backspace; a class escape at either end of a "-" makes
    the "-" a member (ECMA-262's reading). Raises RegexSyntaxError for a range out of order or an
    incomplete \\x / \\u escape."""
    body = text[1:-1]
    negated = body.startswith("^")
    units = _units(pattern, body[negated:], position + 1 + negated)
    members: list[ClassMember] = []
    i = 0
    while i < len(units):
        unit, _ = units[i]
        if i + 2 < len(units) and units[i + 1][1] == "-" and not unit.escape and not units[i + 2][0].escape:
            low, high = unit.low, units[i + 2][0].low
            if high < low:
                raise RegexSyntaxError(pattern, f"bad range {low}-{high}", position)
            members.append(ClassMember(low, high))
            i += 3
            continue
        members.append(unit)
        i += 1
    return negated, members


def _units(pattern: str, body: str, position: int) -> list[tuple[ClassMember, str]]:
    """Each character or escape of a class body, as a one-character range or a class escape, with
    its text as written."""
    units: list[tuple[ClassMember, str]] = []
    i = 0
    while i < len(body):
        if body[i] != "\\":
            units.append((ClassMember(body[i], body[i]), body[i]))
            i += 1
            continue
        letter = body[i + 1]
        width = 2
        if letter in "xu":
            digits = body[i + 2:i + 2 + {"x": 2, "u": 4}[letter]]
            if len(digits) != {"x": 2, "u": 4}[letter] or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise RegexSyntaxError(pattern, f"bad \\{letter} escape", position + i)
            width += len(digits)
        written = body[i:i + width]
        char = "\b" if letter == "b" else escaped_char(written)
        units.append((ClassMember(escape=letter) if char is None else ClassMember(char, char), written))
        i += width
    return units
