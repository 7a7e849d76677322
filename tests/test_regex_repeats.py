"""grammar/regex_repeats.py: large counted repeats of a Regex terminal as EBNF repetitions."""
from __future__ import annotations

import json
import random

import pytest

from grammar.regex_repeats import native_repeats, with_native_repeats

WORDS = 'Regex("^(?:\\\\S+\\\\s+)$", json_string=true)'
LAST_WORD = 'Regex("^\\\\S+$", json_string=true)'


def test_word_count_pattern_becomes_a_repetition_of_its_group():
    assert native_repeats(r"^(?:\S+\s+){0,99}\S+$") == f"(({WORDS}){{0, 99}} {LAST_WORD})"


def test_a_group_holding_a_large_repeat_is_split_inside_and_keeps_its_own_count():
    assert native_repeats(r"^((?:\S+\s+){0,99}\S+){0,1}$") == f"((({WORDS}){{0, 99}} {LAST_WORD})){{0, 1}}"


def test_plain_parts_stay_one_regex_and_alternatives_split_one_by_one():
    assert native_repeats(r"^ab(c|d){2,20}x$") == ('(Regex("^ab$", json_string=true) '
                                                   '(Regex("^(?:c|d)$", json_string=true)){2, 20} '
                                                   'Regex("^x$", json_string=true))')
    assert native_repeats(r"^(a{10}|b|)$") == '((Regex("^a$", json_string=true)){10, 10} | Regex("^b$", json_string=true) | "")'
    assert native_repeats(r"^(?P<w>x\d){10,}$", "false") == '(Regex("^(?:x\\\\d)$", json_string=false)){10, -1}'


@pytest.mark.parametrize("pattern", [
    r"^\d{1,5}$",  # nothing large
    r"(?:\S+\s+){0,99}",  # not anchored: a search, not a full match
    r"^(?=a)b{10}$", r"^(a)\1{10}$", r"^\bx{10}$", r"^(?i)x{10}$",  # look past a piece's edges
    r"^a|b{10}$", r"^(^a)b{10}$",  # the anchors do not bind the whole pattern
    r'^\\"{10}$', r'^"{10}$',  # JSON-text escapes are pairs of characters
    r"^(?:a?){0,99}$",  # an empty part repeated: ambiguous at every count
    r"^a{10}\$", r"^(a{10}$",  # a literal dollar; unbalanced
])
def test_forms_that_cannot_be_split_exactly_are_left_alone(pattern):
    assert native_repeats(pattern) is None


def test_only_whole_rule_regex_terminals_with_a_large_count_are_rewritten():
    text = ('root ::= (("\\"" root_1 "\\"") | ("\\"" root_2 "\\""))\n'
            'root_1 ::= Regex("^(\\?:\\\\S+\\\\s+){0,99}\\\\S+$", json_string=true)\n'
            'root_2 ::= Regex("^\\\\d{1,5}$", json_string=true)\n')
    lines = with_native_repeats(text).splitlines()
    assert lines[0] == text.splitlines()[0]
    assert lines[1] == f"root_1 ::= (({WORDS}){{0, 99}} {LAST_WORD})"
    assert lines[2] == text.splitlines()[2]


@pytest.fixture(scope="module")
def xgr():
    import xgrammar
    return xgrammar


@pytest.mark.parametrize("pattern", [
    r"^(?:\S+\s+){0,3}\S+$", r"^((?:\S+\s+){0,2}\S+){0,1}$", r"^[a-c]{2,4}$", r"^(ab|b){2,}x$",
    r"^x(?:[^a ]+ ?){1,3}$", r"^(a{2}|b|)c$",
])
def test_the_split_grammar_accepts_exactly_what_xgrammar_s_regex_does(xgr, pattern):
    from xgrammar.testing import _is_grammar_accept_string

    split = native_repeats(pattern, min_count=2)
    assert split is not None
    escaped = pattern.replace("\\", "\\\\")
    original = xgr.Grammar.from_ebnf(f'root ::= Regex("{escaped}", json_string=true)')
    rewritten = xgr.Grammar.from_ebnf(f"root ::= {split}")
    rng = random.Random(0)
    alphabet = ["a", "b", "c", "x", " ", "  ", "\t", "\u00a0", "é", '"', "\\"]
    texts = {"".join(rng.choice(alphabet) for _ in range(rng.randrange(9))) for _ in range(400)}
    texts |= {"a b c d", "a b c d e", "ab", "abbx", "bbx", "x", "xb a b", "aac", "c", "bc"}
    accepted = 0
    for text in texts:
        expected = _is_grammar_accept_string(original, text)
        assert _is_grammar_accept_string(rewritten, text) == expected, (pattern, text)
        accepted += expected
    assert accepted > 0


def test_a_word_count_schema_compiles_fast_and_counts_words_exactly():
    from grammar_factories import accepts, make_backend, make_constraint

    schema = {"type": "string", "pattern": r"^(?:\S+\s+){0,99}\S+$"}
    compiled = make_backend().compile(make_constraint(spec=schema, strict=True))
    assert accepts(compiled, json.dumps(" ".join(["word"] * 100)))
    assert not accepts(compiled, json.dumps(" ".join(["word"] * 101)))
    assert not accepts(compiled, json.dumps("two words "))
