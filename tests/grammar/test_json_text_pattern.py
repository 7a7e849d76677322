"""Patterns that name a quote or a backslash, written for the JSON text xgrammar matches them against:
hand-computed rewrites, then every short string and text checked with Python's json and re."""
from __future__ import annotations

import itertools
import json
import re

import pytest

from grammar.json_schema.json_text_pattern import classes_without_escapes, json_text_pattern, names_quote_or_backslash
from grammar.xgrammar.schema_gaps import find_unsupported, normalize


@pytest.mark.parametrize("pattern, expected", [
    (r'^a"b$', r'^a(\\")b$'),
    (r"^a\"b$", r'^a(\\")b$'),
    (r"^a\\b$", r"^a(\\\\)b$"),
    (r"^a\x5cb$", r"^a(\\\\)b$"),
    (r"^a\u0022+$", r'^a(\\")+$'),
    (r"^[\\]$", r"^(\\\\)$"),
    (r'^["\\]{2}$', r'^(\\"|\\\\){2}$'),
    (r'^[^"]*"$', r'^[^"]*(\\")$'),  # the negated class cannot emit either: left as it is
    (r"\w+[\\](\w+\.)*\w+\.dll", r"\w+(\\\\)(\w+\.)*\w+\.dll"),
])
def test_quote_and_backslash_become_their_escapes(pattern, expected):
    assert json_text_pattern(pattern) == expected


@pytest.mark.parametrize("pattern", [r"^[ -~]{2}$", r"^\d+\.[a-z]$", r"^[^a]\S*$"])
def test_a_pattern_naming_neither_is_unchanged(pattern):
    assert not names_quote_or_backslash(pattern)
    assert json_text_pattern(pattern) == pattern


@pytest.mark.parametrize("pattern", [
    r'^[!-"]+$', r'^["-z]$', r'^(a)\1"$', r'^[]"]$',
    r'^[a"]+$', r'^[ -~"]$',  # the escapes beside other members: an alternation xgrammar misreads
    r'^(a|")$', r'^a"|b$',
])
def test_forms_it_cannot_rewrite_stay_refused(pattern):
    assert json_text_pattern(pattern) is None
    schema = {"type": "string", "pattern": pattern}
    assert [f.keyword for f in find_unsupported(schema)] == ["pattern"]
    assert "pattern" not in normalize(schema)  # best effort: dropped, never handed over unescaped


def test_normalize_hands_xgrammar_the_json_text_form_and_the_checker_accepts_it():
    schema = {"type": "object", "properties": {"q": {"type": "string", "pattern": r'^say "[a-z]+"$'}}}
    assert find_unsupported(schema) == []
    assert normalize(schema)["properties"]["q"]["pattern"] == r'^say (\\")[a-z]+(\\")$'


ALPHABET = 'ab"\\-'
# every other part matches neither character in Python either (xgrammar leaves them out of
# negated classes and `.`, Python does not), so Python's re stands in for xgrammar here
PATTERNS = [r'^a"b$', r"^a\\b$", r'^["\\]{2}$', r'^[^"\\]*"$', r'^[^a"\\]"$', r'^[ab]{1,3}"?$',
            r'^"[a-]*"$', r'^\x22(\x5c)*b$', r'^(a\\)+"$', r'^-?[\\"]+b?$']


def _texts(max_length: int):
    for length in range(max_length + 1):
        for chars in itertools.product(ALPHABET, repeat=length):
            yield "".join(chars)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_every_matching_string_has_its_escaped_text_matched(pattern):
    text_pattern = json_text_pattern(pattern)
    for value in _texts(4):
        if re.fullmatch(pattern, value):
            assert re.fullmatch(text_pattern, json.dumps(value)[1:-1]), value


@pytest.mark.parametrize("pattern", PATTERNS)
def test_every_matched_text_is_json_whose_value_matches(pattern):
    text_pattern = json_text_pattern(pattern)
    matched = 0
    for text in _texts(5):
        if re.fullmatch(text_pattern, text):
            matched += 1
            value = json.loads(f'"{text}"')  # raises if the text is not a JSON string body
            assert re.fullmatch(pattern, value), text
    assert matched
    assert not re.fullmatch(text_pattern, "\\u0022") and not re.fullmatch(text_pattern, "\\u005c")


@pytest.mark.parametrize("pattern, expected", [
    (r'^[a"]+$', r"^[a]+$"),
    (r'^[ -~"\\]{2}$', r"^[ -~]{2}$"),
    (r'^["^a]$', r"^[\^a]$"),  # "^" first would negate the class
    (r'^[a"-]$', r"^[a-]$"),  # a trailing "-" stays a literal
    (r'^x"[b\x22c]$', r'^x"[bc]$'),  # only classes change; the quote outside is json_text_pattern's
    (r'^[a"]|b$', r"^[a]|b$"),
])
def test_classes_lose_their_quote_and_backslash_members(pattern, expected):
    assert classes_without_escapes(pattern) == expected
    assert json_text_pattern(expected) is not None  # and xgrammar can be handed the result


@pytest.mark.parametrize("pattern", [r'^[!-"]+$', r'^["-z]$', r'^[^a"]$', r'^["]$', r'^a"b$', r"^[a-z]$"])
def test_classes_without_other_members_ranges_or_negation_are_not_narrowed(pattern):
    assert classes_without_escapes(pattern) is None


@pytest.mark.parametrize("pattern", [r'^[a"]+$', r'^["^a]$', r'^[a"-]$', r'^[b\\-]*a$', r'^-?[\\a"]{1,2}b?$'])
def test_a_narrowed_class_matches_only_what_the_original_does(pattern):
    narrower = classes_without_escapes(pattern)
    matched = [value for value in _texts(4) if re.fullmatch(narrower, value)]
    assert matched and all(re.fullmatch(pattern, value) for value in matched)
    assert not any('"' in value or "\\" in value for value in matched)
