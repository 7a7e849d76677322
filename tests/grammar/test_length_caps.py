"""Length bounds beside patterns with groups: the capped repeats, computed by hand."""
from __future__ import annotations

import re

import pytest

from grammar.json_schema.rewrite import rewrite
from grammar.xgrammar.schema_gaps import ENFORCED_FORMATS
from grammar.regex.length_caps import cap_lengths
from grammar.regex.length_pattern import fold_lengths, implied_lengths

WORDS = r"^(?:\S+\s+){0,29}\S+$"  # at most 30 words
NUMBER = r"^( )*(-|\+){0,1}[0-9]*(.[0-9]+){0,1}((e|E)(-|\+){0,1}[0-9]+){0,1}( )*$"


@pytest.mark.parametrize("pattern, low, high, expected", [
    # whitespace capped at one turn, then 29 * (K + 1) + K <= 300: words of at most 9 characters
    (WORDS, 0, 300, (r"^(?:\S{1,9}\s){0,29}\S{1,9}$", True)),
    # the spaces at one turn each, then 1 + 1 + K + (1 + K) + (1 + 1 + K) + 1 <= 16: K = 3
    (NUMBER, 0, 16, (r"^( ){0,1}(-|\+){0,1}[0-9]{0,3}(.[0-9]{1,3}){0,1}((e|E)(-|\+){0,1}[0-9]{1,3}){0,1}( ){0,1}$",
                     True)),
    # a GitHub user name: 1 + 2 K <= 39
    (r"^[a-zA-Z0-9](-?[a-zA-Z0-9])*$", 0, 39, (r"^[a-zA-Z0-9](-?[a-zA-Z0-9]){0,19}$", True)),
    # one variable repeat of a fixed-width group: its counts are the lengths, exactly
    (r"^(ab)+$", 0, 7, (r"^(ab){1,3}$", False)),
    (r"^(?:ab|cd)*x$", 5, None, (r"^(?:ab|cd){2,}x$", False)),
    # the minimum goes to the top-level repeat with the most room
    (r"^[a-z]+(?:-[a-z0-9]+)*$", 3, None, (r"^[a-z]{3,}(?:-[a-z0-9]+)*$", True)),
    # an alternative no match of which fits is dropped; the other is capped
    (r"^a{5}$|^(b)+$", 0, 3, (r"^(b){1,3}$", False)),
])
def test_cap_lengths(pattern, low, high, expected):
    assert cap_lengths(pattern, low, high) == expected


@pytest.mark.parametrize("pattern, low, high", [
    (r"^(?=a)\w+$", 0, 3),  # lookaround
    (r"(a|b)+", 0, 3),  # not anchored
    (r"^a(^b)+$", 0, 3),  # an anchor inside
    (r"^(a)\1$", 0, 3),  # a back-reference
    (r"^(ab){3}$", 0, 4),  # every match is too long
    (r"^(a+b+)+$", 0, 1),  # the shortest match is too long
    (r"^[a-z]+(?:-[a-z0-9]+)*$", 3, 12),  # capped for 12, no repeat of a fixed width has room for 3
])
def test_what_it_cannot_cap_is_left_alone(pattern, low, high):
    assert cap_lengths(pattern, low, high) is None


@pytest.mark.parametrize("pattern, low, high", [
    (WORDS, 0, 300), (WORDS, 5, 300), (NUMBER, 2, 16), (r"^[a-z]+(?:-[a-z0-9]+)*$", 2, 12),
    (r"^(?:ab|c)+(-x)*$", 3, 9),
])
def test_every_match_of_the_capped_pattern_has_an_allowed_length(pattern, low, high):
    capped, _ = cap_lengths(pattern, low, high)
    for text in ("ab", "ab c", "a" * 9 + " b", "x " * 29 + "y", "-12.5e3", " 1", "abc-d", "abab-x",
                 "ab" * 5 + "-x", "a b c", "abc", "c-x-x", "a" * 10, "ab-cd-ef-gh"):
        if re.fullmatch(capped, text):
            assert re.fullmatch(pattern, text) and low <= len(text) <= high, text


def test_fold_lengths_drops_bounds_that_say_nothing():
    assert fold_lengths(r"^$|(^(?:\S+\s+){0,99}\S+$)", 0, None) == (r"^$|(^(?:\S+\s+){0,99}\S+$)", False)


def test_the_rewrite_caps_only_where_it_may_narrow():
    schema = {"type": "object", "properties": {"notes": {"type": "string", "pattern": WORDS, "maxLength": 300}}}
    result = rewrite(schema, ENFORCED_FORMATS)
    assert result.schema["properties"]["notes"] == {"type": "string", "pattern": r"^(?:\S{1,9}\s){0,29}\S{1,9}$"}
    assert "length-pattern at /properties/notes" in result.narrowed
    branch = {"type": "string", "pattern": WORDS, "maxLength": 300}
    one_of = {"oneOf": [branch, {"type": "string", "maxLength": 3}]}
    assert rewrite(one_of, ENFORCED_FORMATS).schema["oneOf"][0] == branch  # a oneOf's branch: narrowing could widen it


@pytest.mark.parametrize("pattern, expected", [
    (r"^[a-z]{2,5}$", (2, 5)),
    (r"^(?:ab|c)+$|^$", (0, None)),
    (r"^a\\$", (2, 2)),  # an escaped backslash, then the end: one parse reads it so, as the caps do
    (r"^a$b", None),  # an anchor inside
    (r"^(?=a)a$", None),  # lookaround
    (r"^\bword$", None),  # a position, not a character
    (r"a+", None),  # not anchored at both ends
])
def test_implied_lengths(pattern, expected):
    assert implied_lengths(pattern) == expected


@pytest.mark.parametrize("pattern, low, high, expected", [
    (r"^\p{L}{2,}$", 0, 5, (r"^\p{L}{2,5}$", False)),  # a property class is one character
    (r"^[]a]+$", 1, 3, (r"^[]a]{1,3}$", False)),  # a "]" first in a class is a member
    (r"^\pL\b}+$", 0, 5, None),  # \p without braces is not read as far as the next "}"
])
def test_fold_lengths_of_single_character_atoms(pattern, low, high, expected):
    assert fold_lengths(pattern, low, high) == expected
