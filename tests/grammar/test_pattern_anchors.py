"""Anchors inside a pattern (`^a$|^b$`), hoisted out of its alternatives: xgrammar warns about them."""
from __future__ import annotations

import re

import pytest

from grammar.json_schema.patterns import hoisted_anchors


@pytest.mark.parametrize("pattern, expected", [
    (r"^$|(^(?:\S+\s+){0,99}\S+$)", r"^((?:\S+\s+){0,99}\S+){0,1}$"),  # empty, or up to 100 words
    (r"^a$|^b+$", r"^(a|b+)$"),
    (r"(^a$)|(^b$)", r"^(a|b)$"),
    (r"^a$|^$", r"^(a){0,1}$"),
    (r"^a$|^a$", r"^(a)$"),
    (r"^a|b", r"^a|b"),  # not anchored at both ends: left alone
    (r"^a$|^b", r"^a$|^b"),
    (r"^(a|b)$", r"^(a|b)$"),  # one alternative
    (r"^(a)\1$|^b$", r"^(a)\1$|^b$"),  # a back-reference: groups may not be renumbered
    (r"^a$b$|^c$", r"^a$b$|^c$"),  # an anchor inside an alternative
])
def test_hoisted_anchors(pattern, expected):
    assert hoisted_anchors(pattern) == expected


@pytest.mark.parametrize("pattern", [r"^$|(^(?:\S+\s+){0,3}\S+$)", r"^a$|^b+$", r"(^a$)|(^b$)", r"^a$|^$"])
def test_the_hoisted_pattern_has_the_same_full_matches(pattern):
    hoisted = hoisted_anchors(pattern)
    for text in ["", "a", "b", "bb", "ab", "a b", "x y z", " x", "x ", "a b c d e"]:
        assert bool(re.fullmatch(pattern, text)) == bool(re.fullmatch(hoisted, text)), text
