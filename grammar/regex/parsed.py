"""A regular expression parsed once into alternatives of quantified atoms: the one form every
reader of patterns walks (the length analyses, the shortest suffixes, the EBNF conversion).

The form: a pattern is a list of alternatives; an alternative is a list of `Atom`s; an atom is one
character unit as written (a character, an escape, a [...] class), a group (with its own
alternatives), or an anchor (`^`, `$`), each with the quantifier it carries.

The syntax is ECMA-262's (JSON Schema's `pattern`), without the u flag: a quantifier is `*`, `+`,
`?` or `{m}` `{m,}` `{m,n}` with digits only, optionally lazy (`?` after it); a `{` that does not
open one is a literal character (`a{,5}`, `a{ 2}`), as are `}` and `]`. A quantifier on a
quantifier (`a**`, `a{2}+`, `a{2}{3}`), on nothing, or on an anchor, `{n,m}` with n > m, an
unbalanced group or class, a lookaround or an inline flag are refused with a `RegexSyntaxError`
naming what and where. Groups: `(`, `(?:` and named `(?<name>` (also Python's `(?P<name>`). One
reading stays Python's, as every reader here has always read it: a "]" first in a class is a
member (`[]a]` is one class; ECMA-262 reads `[]` as an empty class, so `[]` and `[^]` alone are
unterminated here). Escapes are kept as written whatever they mean (\\b, \\1, \\p{L}): each
reader refuses those it does not model. The atoms are the pattern's own text, so an analysis that
changes counts renders the rest unchanged.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field


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


class RegexSyntaxError(ValueError):
    """A pattern this syntax refuses; the message names the pattern, what and where."""

    def __init__(self, pattern: str, what: str, position: int) -> None:
        super().__init__(f"regex /{pattern}/: {what} at position {position}")
        self.what = what
        self.position = position


def parse_pattern(pattern: str) -> list[list[Atom]]:
    """The alternatives of `pattern`; raises RegexSyntaxError where the syntax refuses it."""
    parser = _Parser(pattern)
    try:
        parsed = parser.alternatives()
    except RecursionError:
        raise RegexSyntaxError(pattern, "groups nested too deeply", parser.i) from None
    if parser.i < len(pattern):  # only an unbalanced ")" stops the top level early
        raise RegexSyntaxError(pattern, "unbalanced ')'", parser.i)
    return parsed


def parse_regex(pattern: str) -> list[list[Atom]] | None:
    """The alternatives of `pattern`, or None where the syntax refuses it (see the module docstring)."""
    try:
        return parse_pattern(pattern)
    except RegexSyntaxError:
        return None


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
    """A recursive reader of the form above; raises RegexSyntaxError where the syntax refuses."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.i = 0

    def fail(self, what: str, position: int | None = None) -> RegexSyntaxError:
        return RegexSyntaxError(self.pattern, what, self.i if position is None else position)

    def alternatives(self) -> list[list[Atom]]:
        out: list[list[Atom]] = [[]]
        pattern = self.pattern
        while self.i < len(pattern) and pattern[self.i] != ")":
            if pattern[self.i] == "|":
                out.append([])
                self.i += 1
                continue
            out[-1].append(self.atom())
        return out

    def atom(self) -> Atom:
        pattern, start = self.pattern, self.i
        char = pattern[start]
        alternatives: list[list[Atom]] = []
        if char in "^$":
            self.i += 1
            if self.i < len(pattern) and (pattern[self.i] in "*+?" or _braced(pattern, self.i)):
                raise self.fail("a quantifier after an anchor")
            return Atom(char, 1, 1, "", anchor=True)
        if char == "(":
            opener = self.group_opener()
            self.i += len(opener)
            alternatives = self.alternatives()
            if not pattern.startswith(")", self.i):
                raise self.fail("missing ')'")
            self.i += 1
            text = opener
        elif char == "[":
            self.i = _class_end(self, start)
            text = pattern[start:self.i]
        elif char == "\\":
            if start + 1 >= len(pattern):
                raise self.fail("a trailing backslash")
            self.i = start + _escape_width(pattern, start)
            text = pattern[start:self.i]
        elif char in "*+?" or _braced(pattern, start):
            raise self.fail("nothing to repeat")
        else:  # "{" "}" "]" that open nothing are characters
            self.i += 1
            text = char
        quantifier_start = self.i
        low, high = self.quantifier()
        return Atom(text, low, high, pattern[quantifier_start:self.i], alternatives)

    def group_opener(self) -> str:
        rest = self.pattern[self.i:]
        if not rest.startswith("(?"):
            return "("
        if rest.startswith("(?:"):
            return "(?:"
        if named := re.match(r"\(\?P?<[A-Za-z_]\w*>", rest):
            return named.group()
        if rest.startswith(("(?=", "(?!", "(?<=", "(?<!")):
            raise self.fail("a lookaround")
        raise self.fail("an inline flag or extension group")

    def quantifier(self) -> tuple[int, int | None]:
        """(low, high) of the quantifier at i (1, 1 where there is none), i moved past it."""
        pattern, start = self.pattern, self.i
        if start >= len(pattern):
            return 1, 1
        if pattern[start] in "*+?":
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[pattern[start]]
            self.i += 1
        elif braced := _braced(pattern, start):
            if any(len(count.lstrip("0")) > _MAX_COUNT_DIGITS for count in braced.group(1, 3) if count):
                raise self.fail("a repeat count too long to read", start)
            low, high = int(braced.group(1)), (int(braced.group(3)) if braced.group(3) else None)
            if not braced.group(2):
                high = low
            if high is not None and high < low:
                raise self.fail("numbers out of order in a {} quantifier", start)
            self.i = braced.end()
        else:
            return 1, 1
        if pattern.startswith("?", self.i):  # lazy: the same set of full matches
            self.i += 1
        elif pattern.startswith("+", self.i):
            raise self.fail("a possessive quantifier")
        if self.i < len(pattern) and (pattern[self.i] in "*+?" or _braced(pattern, self.i)):
            raise self.fail("nothing to repeat")
        return low, high


_MAX_COUNT_DIGITS = 4000  # int() refuses longer digit strings; no regex library reads such counts
_BRACED = re.compile(r"\{(\d+)(,(\d*))?\}")  # ECMA-262's braced quantifier: digits only


def _braced(pattern: str, i: int) -> re.Match[str] | None:
    return _BRACED.match(pattern, i)


def _class_end(parser: _Parser, start: int) -> int:
    """The index after the class opened at `start`: its first unescaped "]" that is not its first member."""
    pattern = parser.pattern
    j = start + 1 + pattern.startswith("^", start + 1)
    j += pattern.startswith("]", j)  # a "]" first is a member (see the module docstring)
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    if j >= len(pattern):
        raise parser.fail("unterminated character class", start)
    return j + 1


_HEX_WIDTHS = {"x": 2, "u": 4}  # without their hex digits they are the letter itself


def _escape_width(pattern: str, start: int) -> int:
    """Characters of the escape at `start`: \\uXXXX, \\xXX, \\p{Name} / \\P{Name} whole, else two."""
    letter = pattern[start + 1]
    if letter in "pP" and pattern.startswith("{", start + 2):
        close = pattern.find("}", start)
        return close - start + 1 if close >= 0 else 2
    digits = _HEX_WIDTHS.get(letter, 0)
    text = pattern[start + 2:start + 2 + digits]
    if digits and len(text) == digits and all(d in "0123456789abcdefABCDEF" for d in text):
        return 2 + digits
    return 2
