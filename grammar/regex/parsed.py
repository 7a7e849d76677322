"""A regular expression parsed once into alternatives of quantified atoms, for the analyses that
read its structure (lengths, caps) rather than its text.

The form: a pattern is a list of alternatives; an alternative is a list of `Atom`s; an atom is one
character unit as written (a character, an escape, a [...] class), a group (with its own
alternatives), or an anchor (`^`, `$`), each with the quantifier it carries. What the parser
cannot delimit gives None: an unbalanced group or class, a quantifier with nothing to repeat, a
group opened with `(?` other than `(?:` (lookaround, named groups, flags). A class ends at the
first unescaped `]` that is not its first member (as Python reads `[]a]`; ECMA-262 reads `[]` as
empty: the analyses refuse `[]` and `[^]`). Escapes are kept as written whatever they mean (\\b,
\\1, \\p{L}): each analysis refuses those it does not model. The
atoms of the tree are the pattern's own text, so an analysis that changes counts renders the rest
unchanged.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from grammar.regex.pieces import quantifier

# escapes that match no character (a position), whatever an analysis does with them
ZERO_WIDTH_ESCAPES = frozenset("bBAzZG")


@dataclass
class Atom:
    """One atom and its quantifier: a character unit (`text`), a group (`alternatives`) or an anchor."""

    text: str  # the atom as written ("(" or "(?:" for a group)
    low: int
    high: int | None  # None: unbounded
    quantifier_text: str  # as written, kept while the counts are unchanged
    alternatives: list[list[Atom]] = field(default_factory=list)
    anchor: bool = False  # "^" or "$"

    def __post_init__(self) -> None:
        self.written = (self.low, self.high)  # the counts as the pattern wrote them

    @property
    def escape(self) -> str:
        """The letter of an escape ("d" for \\d), else ""."""
        return self.text[1:2] if self.text.startswith("\\") else ""

    def render(self) -> str:
        if self.anchor:
            return self.text
        body = self.text + ("|".join(render(a) for a in self.alternatives) + ")" if self.alternatives else "")
        return body + self._quantifier()

    def _quantifier(self) -> str:
        if (self.low, self.high) == self.written:
            return self.quantifier_text
        if (self.low, self.high) == (1, 1):
            return ""
        if self.high is None:
            return {0: "*", 1: "+"}.get(self.low, f"{{{self.low},}}")
        return f"{{{self.low}}}" if self.low == self.high else f"{{{self.low},{self.high}}}"


def parse_regex(pattern: str) -> list[list[Atom]] | None:
    """The alternatives of `pattern`, or None where it cannot be delimited (see the module docstring)."""
    parser = _Parser(pattern)
    parsed = parser.alternatives()
    return parsed if parsed is not None and parser.i == len(pattern) else None


def render(sequence: list[Atom]) -> str:
    return "".join(atom.render() for atom in sequence)


def walk(sequence: list[Atom], outside_repeats: bool = False) -> Iterator[Atom]:
    """Every atom of the sequence, nested ones too (with `outside_repeats`: only those inside
    groups that match once)."""
    for atom in sequence:
        yield atom
        if outside_repeats and (atom.low, atom.high) != (1, 1):
            continue
        for alternative in atom.alternatives:
            yield from walk(alternative, outside_repeats)


def lengths(sequence: list[Atom]) -> tuple[int, int | None]:
    """(shortest, longest or None) length of the sequence's matches; anchors and escapes count as
    written (an anchor 0, any other escape 1): the caller refuses what that misreads."""
    low, high = 0, 0
    for atom in sequence:
        if atom.anchor:
            continue
        if atom.alternatives:
            inner = [lengths(a) for a in atom.alternatives]
            body_low = min(i[0] for i in inner)
            body_high = None if any(i[1] is None for i in inner) else max(i[1] for i in inner)  # type: ignore[type-var]
        else:
            body_low = body_high = 1
        low += atom.low * body_low
        if high is not None:
            high = None if atom.high is None or body_high is None else high + atom.high * body_high
    return low, high


class _Parser:
    """A recursive reader of the form above; None from any method: not delimited."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.i = 0

    def alternatives(self) -> list[list[Atom]] | None:
        out: list[list[Atom]] = [[]]
        pattern = self.pattern
        while self.i < len(pattern) and pattern[self.i] != ")":
            if pattern[self.i] == "|":
                out.append([])
                self.i += 1
                continue
            atom = self.atom()
            if atom is None:
                return None
            out[-1].append(atom)
        return out

    def atom(self) -> Atom | None:
        pattern, start = self.pattern, self.i
        char = pattern[start]
        alternatives: list[list[Atom]] = []
        if char in "^$":
            self.i += 1
            return Atom(char, 1, 1, "", anchor=True)
        if char == "(":
            opener = "(?:" if pattern.startswith("(?:", start) else "("
            if pattern.startswith("(?", start) and opener == "(":
                return None  # lookaround, named groups, flags
            self.i += len(opener)
            inner = self.alternatives()
            if inner is None or not pattern.startswith(")", self.i):
                return None
            self.i += 1
            text, alternatives = opener, inner
        elif char == "[":
            j = start + 1 + pattern.startswith("^", start + 1)
            j += pattern.startswith("]", j)  # a "]" first is a member
            while j < len(pattern) and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            if j >= len(pattern):
                return None
            self.i = j + 1
            text = pattern[start:self.i]
        elif char == "\\":
            if start + 1 >= len(pattern):
                return None
            self.i = start + _escape_width(pattern, start)
            text = pattern[start:self.i]
        elif char in "*+?{}":
            return None
        else:
            self.i += 1
            text = char
        low, high, end = quantifier(pattern, self.i, len(pattern))
        if low < 0:
            return None
        quantifier_text = pattern[self.i:end]
        self.i = end
        return Atom(text, low, high, quantifier_text, alternatives)


def _escape_width(pattern: str, start: int) -> int:
    """Characters of the escape at `start`: \\uXXXX, \\xXX, \\p{Name} / \\P{Name} whole, else two."""
    letter = pattern[start + 1]
    if letter in "pP" and pattern.startswith("{", start + 2):
        close = pattern.find("}", start)
        return close - start + 1 if close >= 0 else 2
    return {"u": 6, "x": 4}.get(letter, 2)
