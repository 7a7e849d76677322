"""A regular expression as one xgrammar EBNF expression (xgrammar's EBNF has no /regex/ atom).

Covers the subset grammar terminals use: literals and escapes, `.`, classes (ranges, negation,
\\d \\w \\s), groups (plain, non-capturing, named), alternation, the quantifiers ? * + {m} {m,}
{m,n} (lazy forms match the same strings), and ^ / $ at the ends. Whatever changes what matches
in a way a context-free grammar cannot say (lookarounds, backreferences, inline flags, \\b) is
refused with a ValueError naming it. Pure Python.
"""
from __future__ import annotations

import re

_CLASS_ESCAPES = {"d": "0-9", "w": "a-zA-Z0-9_", "s": " \\t\\n\\r\\f\\v"}
_CHAR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0", "a": "\a"}
_QUANTIFIER = re.compile(r"\{(\d+)(,(\d*))?\}")


def regex_to_ebnf(pattern: str) -> str:
    """The EBNF expression matching exactly the strings `pattern` fully matches."""
    parser = _RegexParser(pattern)
    expression = parser.alternation()
    if parser.pos < len(pattern):  # only an unbalanced ")" stops the top level early
        raise ValueError(f"regex /{pattern}/: unbalanced ')' at position {parser.pos}")
    return expression


def string_literal(text: str) -> str:
    """`text` as an EBNF string literal."""
    return '"' + "".join(_escape(c, '\\"') for c in text) + '"'


def char_class(items: str, negated: bool = False) -> str:
    """An EBNF class from already-escaped items (characters and a-b ranges)."""
    return f"[{'^' if negated else ''}{items}]"


def class_char(c: str) -> str:
    """One character escaped for use inside an EBNF class."""
    return _escape(c, "\\]-^")


def _escape(c: str, specials: str) -> str:
    if c in specials:
        return "\\" + c
    if c == "\n":
        return "\\n"
    if c == "\t":
        return "\\t"
    if c == "\r":
        return "\\r"
    if ord(c) < 0x20 or ord(c) == 0x7F:
        return f"\\x{ord(c):02x}"
    return c


class _RegexParser:
    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.pos = 0

    def _fail(self, what: str) -> ValueError:
        return ValueError(f"regex /{self.pattern}/: {what} (at position {self.pos}) cannot be expressed in a grammar")

    def _peek(self) -> str | None:
        return self.pattern[self.pos] if self.pos < len(self.pattern) else None

    def alternation(self) -> str:
        branches = [self.sequence()]
        while self._peek() == "|":
            self.pos += 1
            branches.append(self.sequence())
        return branches[0] if len(branches) == 1 else "(" + " | ".join(branches) + ")"

    def sequence(self) -> str:
        items: list[str] = []
        while self._peek() not in (None, "|", ")"):
            item = self.quantified()
            if item:
                items.append(item)
        if not items:
            return '""'
        return items[0] if len(items) == 1 else "(" + " ".join(items) + ")"

    def quantified(self) -> str:
        atom = self.atom()
        while True:
            c = self._peek()
            if c in ("?", "*", "+"):
                self.pos += 1
                suffix = c
            elif c == "{" and (match := _QUANTIFIER.match(self.pattern, self.pos)):
                self.pos = match.end()
                low, comma, high = match.group(1), match.group(2), match.group(3)
                suffix = "{" + low + ("," + high if comma else "") + "}"  # {m} {m,} {m,n}
            else:
                return atom
            if not atom:
                raise self._fail("a quantifier after an anchor")
            if self._peek() == "?":  # lazy: the same strings match
                self.pos += 1
            elif self._peek() == "+":
                raise self._fail("a possessive quantifier")
            atom = f"({atom}){suffix}" if atom.endswith(("?", "*", "+", "}")) else atom + suffix

    def atom(self) -> str:
        c = self.pattern[self.pos]
        self.pos += 1
        if c == "(":
            return self._group()
        if c == "[":
            return self._class()
        if c == ".":
            return "[^\\n]"
        if c == "^":
            if self.pos != 1:
                raise self._fail("'^' inside the pattern")
            return ""
        if c == "$":
            if self.pos != len(self.pattern):
                raise self._fail("'$' inside the pattern")
            return ""
        if c in "*+?":
            raise ValueError(f"regex /{self.pattern}/: nothing to repeat at position {self.pos - 1}")
        if c == "\\":
            return self._escape_atom()
        return string_literal(c)

    def _group(self) -> str:
        if self.pattern.startswith("?", self.pos):
            rest = self.pattern[self.pos:]
            if rest.startswith("?:"):
                self.pos += 2
            elif named := re.match(r"\?P?<[A-Za-z_]\w*>", rest):
                self.pos += named.end()
            elif rest.startswith(("?=", "?!", "?<=", "?<!")):
                raise self._fail("a lookaround")
            else:
                raise self._fail("an inline flag or extension group")
        inner = self.alternation()
        if self._peek() != ")":
            raise ValueError(f"regex /{self.pattern}/: missing ')'")
        self.pos += 1
        return f"({inner})"

    def _escape_atom(self) -> str:
        if self.pos >= len(self.pattern):
            raise ValueError(f"regex /{self.pattern}/: a trailing backslash")
        c = self.pattern[self.pos]
        self.pos += 1
        if c.lower() in _CLASS_ESCAPES:
            return char_class(_CLASS_ESCAPES[c.lower()], negated=c.isupper())
        if c in "AZz":
            at_edge = self.pos == 2 if c == "A" else self.pos == len(self.pattern)
            if not at_edge:
                raise self._fail(f"'\\{c}' inside the pattern")
            return ""
        if c in "bB":
            raise self._fail(f"a word boundary '\\{c}'")
        if c.isdigit() and c != "0":
            raise self._fail("a backreference")
        return string_literal(self._escaped_char(c))

    def _escaped_char(self, c: str) -> str:
        """The character of an escape whose letter `c` was just read (\\n, \\x41, \\u00e9, \\.)."""
        if c in _CHAR_ESCAPES:
            return _CHAR_ESCAPES[c]
        width = {"x": 2, "u": 4, "U": 8}.get(c)
        if width is None:
            return c
        digits = self.pattern[self.pos:self.pos + width]
        if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
            raise ValueError(f"regex /{self.pattern}/: bad \\{c} escape at position {self.pos - 2}")
        self.pos += width
        return chr(int(digits, 16))

    def _class(self) -> str:
        negated = self._peek() == "^"
        if negated:
            self.pos += 1
        items: list[str] = []
        first = True
        while True:
            c = self._peek()
            if c is None:
                raise ValueError(f"regex /{self.pattern}/: unterminated character class")
            if c == "]" and not first:
                self.pos += 1
                break
            first = False
            self.pos += 1
            if c == "\\":
                if self.pos >= len(self.pattern):
                    raise ValueError(f"regex /{self.pattern}/: unterminated character class")
                letter = self.pattern[self.pos]
                self.pos += 1
                if letter in _CLASS_ESCAPES:
                    items.append(_CLASS_ESCAPES[letter])
                    continue
                if letter.lower() in _CLASS_ESCAPES:
                    raise self._fail(f"a negated class escape '\\{letter}' inside a class")
                low = "\b" if letter == "b" else self._escaped_char(letter)
            else:
                low = c
            if self._peek() == "-" and self.pattern[self.pos + 1:self.pos + 2] not in ("]", ""):
                self.pos += 1
                high = self.pattern[self.pos]
                self.pos += 1
                if high == "\\":
                    letter = self.pattern[self.pos]
                    self.pos += 1
                    high = self._escaped_char(letter)
                if ord(high) < ord(low):
                    raise ValueError(f"regex /{self.pattern}/: bad range {low}-{high}")
                items.append(f"{class_char(low)}-{class_char(high)}")
            else:
                items.append(class_char(low))
        return char_class("".join(items), negated)
