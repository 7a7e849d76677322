"""The shortest ways to finish a regex from each point inside it (no tokenizer, no grammar)."""
from __future__ import annotations

import json
import re

import pytest

from grammar.constraint import Constraint
from grammar.regex.suffixes import MAX_SUFFIXES, regex_suffixes
from grammar.runtime.closing_hints import closing_hints

DLL = r"\w+[\\](\w+\.)*\w+\.dll"


def test_a_counted_pattern_lists_each_point_s_way_out():
    assert regex_suffixes(r"[A-Z]{2}-\d{3}") == ["0", "00", "000", "-000", "A-000", "AA-000"]


def test_a_word_after_a_loop_is_among_the_ways_out():
    suffixes = regex_suffixes(DLL)
    assert suffixes[:4] == ["l", "ll", "dll", ".dll"]
    assert "\\a.dll" in suffixes and "a\\a.dll" in suffixes


@pytest.mark.parametrize("pattern, text", [
    (DLL, "System\\Windows.Forms.dll"),
    (r"^[a-z]+-v[0-9]+\.json$", "schema-v12.json"),
    (r"(foo|barbaz)+(qux)?!", "barbazfoofooqux!"),
    (r"[^@\s]+@example\.(com|org)", "grace.hopper@example.org"),
    (r"\d{3}-\d{4}( ext\. \d+)?", "555-0100 ext. 42"),
])
def test_from_every_point_of_a_match_one_suffix_ends_it(pattern, text):
    suffixes = regex_suffixes(pattern)
    assert re.fullmatch(pattern, text)
    for cut in range(len(text)):
        prefix = text[:cut]
        assert any(re.fullmatch(pattern, prefix + s) for s in suffixes), prefix


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?=a)a", r"(", "a{100}", ""])
def test_what_it_cannot_read_gives_no_suffixes(pattern):
    assert regex_suffixes(pattern) == []


def test_the_list_is_bounded_shortest_first():
    suffixes = regex_suffixes("(" + "|".join(f"word{i}" for i in range(100)) + r")-\d{1,40}")
    assert 0 < len(suffixes) <= MAX_SUFFIXES
    assert [len(s) for s in suffixes] == sorted(len(s) for s in suffixes)


def test_a_schema_pattern_becomes_the_end_of_a_json_string():
    schema = json.dumps({"type": "object", "properties": {"dll": {"type": "string", "pattern": r"\w+[\\]\w+\.dll"}}})
    hints = closing_hints(Constraint("json_schema", schema))
    assert '\\\\a.dll"' in hints  # the backslash escaped, then the closing quote
    assert hints == sorted(hints, key=len)
    assert closing_hints(Constraint("regex", r"\w+\.dll"))[:2] == ["l", "ll"]
    assert closing_hints(Constraint("json_object", "", think_end="</think>")) == ["</think>"]


def test_edge_syntax_is_read_as_json_schema_reads_it():
    assert regex_suffixes("a{,5}")[-1] == "a{,5}"  # ECMA-262: literal text, not 0 to 5 repeats
    assert regex_suffixes("a{2}+") == []  # a quantifier on a quantifier is refused
    assert regex_suffixes("(?<n>ab)\\d") == ["0", "b0", "ab0"]  # named groups are read
