"""A regular expression as one xgrammar EBNF expression (xgrammar's EBNF has no /regex/ atom).

Walks the pattern's parsed form (grammar/regex/parsed.py: ECMA-262 syntax, which also refuses
lookarounds, inline flags and quantified quantifiers): literals and escapes, `.`, classes (ranges,
negation, \\d \\w \\s), groups (plain, non-capturing, named), alternation, the quantifiers ? * +
{m} {m,} {m,n} (lazy forms match the same strings), and ^ / $ (\\A, \\Z, \\z) at the ends.
Whatever changes what matches in a way a context-free grammar cannot say (backreferences, \\b) is
refused with a ValueError naming it. Pure Python.
"""
from __future__ import annotations

from grammar.regex.characters import CLASS_ESCAPES, class_members, escaped_char
from grammar.regex.parsed import Atom, parse_pattern

_CLASS_ESCAPE_MEMBERS = {"d": "0-9", "w": "a-zA-Z0-9_", "s": " \\t\\n\\r\\f\\v"}


def regex_to_ebnf(pattern: str) -> str:
    """The EBNF expression matching exactly the strings `pattern` fully matches."""
    parsed = parse_pattern(pattern)
    return _Converter(pattern, parsed).alternation(parsed)


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


class _Converter:
    """The EBNF of each part of one parsed pattern."""

    def __init__(self, pattern: str, parsed: list[list[Atom]]) -> None:
        self.pattern = pattern
        # the atoms that stand at the pattern's first and last characters: where ^ and $ may be
        self.first = parsed[0][0] if parsed[0] else None
        self.last = parsed[-1][-1] if parsed[-1] else None

    def fail(self, what: str) -> ValueError:
        return ValueError(f"regex /{self.pattern}/: {what} cannot be expressed in a grammar")

    def alternation(self, alternatives: list[list[Atom]]) -> str:
        branches = [self.sequence(alternative) for alternative in alternatives]
        return branches[0] if len(branches) == 1 else "(" + " | ".join(branches) + ")"

    def sequence(self, atoms: list[Atom]) -> str:
        items = [item for atom in atoms for item in self.quantified(atom) if item]
        if not items:
            return '""'
        return items[0] if len(items) == 1 else "(" + " ".join(items) + ")"

    def quantified(self, atom: Atom) -> list[str]:
        """The atom's items (a \\p{...} written without the u flag is several characters), the
        quantifier on the last."""
        items = self.atom(atom)
        if not atom.quantifier_text:
            return items
        if not items[-1]:
            raise self.fail("a quantifier after an anchor")
        # lazy forms match the same full strings; the counts stay as written
        suffix = atom.quantifier_text[:-1] if len(atom.quantifier_text) > 1 and atom.quantifier_text.endswith("?") \
            else atom.quantifier_text
        last = items[-1]
        items[-1] = f"({last}){suffix}" if last.endswith(("?", "*", "+", "}")) else last + suffix
        return items

    def atom(self, atom: Atom) -> list[str]:
        text, letter = atom.text, atom.escape
        if atom.alternatives:
            return [f"({self.alternation(atom.alternatives)})"]
        if atom.anchor or letter in ("A", "Z", "z"):
            at_edge = atom is self.first if text in ("^", "\\A") else atom is self.last
            if not at_edge:
                raise self.fail(f"'{text}' inside the pattern")
            return [""]
        if text == ".":
            return ["[^\\n]"]
        if text.startswith("["):
            return [self.char_class(text)]
        if not letter:
            return [string_literal(text)]
        if letter in CLASS_ESCAPES:
            return [char_class(_CLASS_ESCAPE_MEMBERS[letter.lower()], negated=letter.isupper())]
        if letter in "bB":
            raise self.fail(f"a word boundary '\\{letter}'")
        if letter.isdigit() and letter != "0":
            raise self.fail("a backreference")
        if letter == "U":  # Python's \\UXXXXXXXX is the letter U in ECMA-262: neither reading is safe
            raise self.fail("'\\U' (write the character itself or \\uXXXX)")
        if letter in "pP" and len(text) > 2:  # without the u flag: the letter, then literal text
            return [string_literal(char) for char in text[1:]]
        char = escaped_char(text)
        if char is None:
            raise ValueError(f"regex /{self.pattern}/: bad {text} escape")
        return [string_literal(char)]

    def char_class(self, text: str) -> str:
        negated, members = class_members(self.pattern, text)
        items: list[str] = []
        for member in members:
            if member.escape.isupper():
                raise self.fail(f"a negated class escape '\\{member.escape}' inside a class")
            if member.escape:
                items.append(_CLASS_ESCAPE_MEMBERS[member.escape])
            elif member.low == member.high:
                items.append(class_char(member.low))
            else:
                items.append(f"{class_char(member.low)}-{class_char(member.high)}")
        return char_class("".join(items), negated)
