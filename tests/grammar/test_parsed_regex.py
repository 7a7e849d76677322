"""The one parsed form of a pattern: ECMA-262 syntax at its edges, and what a class holds."""
from __future__ import annotations

import pytest

from grammar.regex.characters import ClassMember, class_members
from grammar.regex.parsed import RegexSyntaxError, parse_pattern, render


def units(pattern: str) -> list[tuple[str, int, int | None]]:
    (alternative,) = parse_pattern(pattern)
    return [(atom.text, atom.low, atom.high) for atom in alternative]


@pytest.mark.parametrize("pattern, expected", [
    ("a{,5}", [("a", 1, 1), ("{", 1, 1), (",", 1, 1), ("5", 1, 1), ("}", 1, 1)]),  # not a quantifier
    ("a{ 2}", [("a", 1, 1), ("{", 1, 1), (" ", 1, 1), ("2", 1, 1), ("}", 1, 1)]),
    ("a{2,}?b{3}", [("a", 2, None), ("b", 3, 3)]),
    ("x}]", [("x", 1, 1), ("}", 1, 1), ("]", 1, 1)]),
    (r"\x41\x4\u00e9\p{L}", [(r"\x41", 1, 1), (r"\x", 1, 1), ("4", 1, 1), (r"\u00e9", 1, 1), (r"\p{L}", 1, 1)]),
    ("(?<year>a)+", [("(?<year>", 1, None)]),
    ("[]a]?", [("[]a]", 0, 1)]),  # a "]" first in a class is a member
])
def test_edge_syntax_reads_as_ecma_262(pattern, expected):
    assert units(pattern) == expected
    assert render(parse_pattern(pattern)[0]) == pattern


@pytest.mark.parametrize("pattern, message", [
    ("a**", "nothing to repeat at position 2"),
    ("a{2}+", "a possessive quantifier at position 4"),
    ("a{2}{3}", "nothing to repeat at position 4"),
    ("{2}", "nothing to repeat at position 0"),
    ("a{3,2}", r"numbers out of order in a \{\} quantifier at position 1"),
    ("^*a", "a quantifier after an anchor"),
    ("(?=a)a", "a lookaround"),
    ("(?<!a)b", "a lookaround"),
    ("(?i)a", "an inline flag"),
    ("(ab", "missing '\\)'"),
    ("ab)", "unbalanced '\\)' at position 2"),
    ("[ab", "unterminated character class"),
    ("a\\", "a trailing backslash"),
])
def test_syntax_ecma_262_refuses_is_named(pattern, message):
    with pytest.raises(RegexSyntaxError, match=message):
        parse_pattern(pattern)


def test_a_class_reads_ranges_escapes_and_a_literal_dash():
    negated, members = class_members(r"[^\x41-\x5a\d_\-]", r"[^\x41-\x5a\d_\-]")
    assert negated
    assert members == [ClassMember("A", "Z"), ClassMember(escape="d"), ClassMember("_", "_"), ClassMember("-", "-")]
    assert class_members(r"[\d-z]", r"[\d-z]")[1] == [ClassMember(escape="d"), ClassMember("-", "-"), ClassMember("z", "z")]
    with pytest.raises(RegexSyntaxError, match="bad range z-a"):
        class_members("[z-a]", "[z-a]")


def test_what_is_too_large_to_read_is_refused_not_crashed_on():
    with pytest.raises(RegexSyntaxError, match="a repeat count too long to read"):
        parse_pattern("a{" + "9" * 5000 + "}")
    assert units("b{00000000000000000007}") == [("b", 7, 7)]
    with pytest.raises(RegexSyntaxError, match="groups nested too deeply"):
        parse_pattern("(" * 5000 + ")" * 5000)
