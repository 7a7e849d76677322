"""The readers of patterns on the one parsed form agree with what they produced when each had its
own parser, except where the old parsers disagreed with ECMA-262 (JSON Schema's `pattern`).

regex_readers_pinned.json holds, for the patterns of bench/data (JSONSchemaBench samples, the
JSON-Schema test suite), the tests' literals and hand-made edge cases, the EBNF the converter gave
with its own parser (null: refused) and the suffixes read through Python's re._parser.
"""
from __future__ import annotations

import json
import pathlib

import pytest

from grammar.regex.suffixes import regex_suffixes
from grammar.xgrammar.regex_ebnf import regex_to_ebnf

PINNED = json.loads((pathlib.Path(__file__).parent / "regex_readers_pinned.json").read_text())

# the old converter's readings ECMA-262 refuses: a quantifier on a quantifier or on nothing, and
# counts out of order; Python's \U, which ECMA-262 reads as the letter U, is refused as ambiguous
NOW_REFUSED_AS_EBNF = {
    "a**": "nothing to repeat",
    "a{2}{3}": "nothing to repeat",
    "a{1,2}{3}": "nothing to repeat",
    "{2}": "nothing to repeat",
    "a{2,1}": "numbers out of order",
    "\\U0001F600": "'\\\\U'",
}
# suffixes read by Python's re._parser where ECMA-262 reads otherwise
ECMA_SUFFIXES = {
    "a{,5}": ["}", "5}", ",5}", "{,5}", "a{,5}"],  # literal text, not 0 to 5 repeats
    "a{2}+": [],  # possessive: refused
    "a++": [],
    "(?i)abc": [],  # inline flags: refused
    "\\U0001F600": ["0", "00", "600", "F600", "1F600", "01F600", "001F600", "0001F600", "U0001F600"],
    "(?<n>ab)\\d": ["0", "b0", "ab0"],  # named groups: read (Python's re refuses this spelling)
}
# re._parser turned (s|m) into a class whose representative is "m"; the tree takes the first branch
OTHER_WITNESS = {"^(\\d+)(s|m)$": "0m"}


def test_the_pinned_patterns_cover_the_carried_data():
    assert len(PINNED) > 300
    assert sum(entry["ebnf"] is None for entry in PINNED.values()) > 20  # refusals are pinned too


@pytest.mark.parametrize("pattern", sorted(PINNED))
def test_the_ebnf_is_the_old_converter_s_except_where_ecma_262_refuses(pattern):
    pinned = PINNED[pattern]["ebnf"]
    if pattern in NOW_REFUSED_AS_EBNF:
        assert pinned is not None
        with pytest.raises(ValueError, match=NOW_REFUSED_AS_EBNF[pattern]):
            regex_to_ebnf(pattern)
    elif pinned is None:
        with pytest.raises(ValueError):
            regex_to_ebnf(pattern)
    else:
        assert regex_to_ebnf(pattern) == pinned


@pytest.mark.parametrize("pattern", sorted(PINNED))
def test_the_suffixes_keep_every_old_one_except_where_ecma_262_reads_otherwise(pattern):
    suffixes = regex_suffixes(pattern)
    if pattern in ECMA_SUFFIXES:
        assert suffixes == ECMA_SUFFIXES[pattern]
        return
    missing = set(PINNED[pattern]["suffixes"]) - set(suffixes)
    assert missing <= {OTHER_WITNESS.get(pattern)}
