"""The accuracy benchmark's scoring, on hand-made answers."""
from __future__ import annotations

import pytest

from bench.scoring import exact_match, field_accuracy, parse_answer

EXPECTED = {"name": "Ada Lovelace", "age": 36, "languages": ["English", "French"], "retired": False}


@pytest.mark.parametrize("answer, accuracy, exact", [
    ({"name": "Ada Lovelace", "age": 36, "languages": ["English", "French"], "retired": False}, 1.0, True),
    ({"name": "Ada Lovelace", "age": 36.0, "languages": ["English", "French"], "retired": False, "x": 1}, 1.0, True),
    ({"name": "ada lovelace", "age": 36, "languages": ["English", "French"], "retired": False}, 0.75, False),
    ({"name": "Ada Lovelace", "age": "36", "languages": ["French", "English"], "retired": 0}, 0.25, False),
    ({"name": "Ada Lovelace"}, 0.25, False),
    ({}, 0.0, False),
    (["Ada Lovelace", 36], 0.0, False),
    (None, 0.0, False),
])
def test_field_accuracy_and_exact_match(answer, accuracy, exact):
    assert field_accuracy(EXPECTED, answer) == pytest.approx(accuracy)
    assert exact_match(EXPECTED, answer) is exact


def test_booleans_are_not_numbers():
    assert field_accuracy({"ok": True}, {"ok": 1}) == 0.0
    assert field_accuracy({"n": 1}, {"n": True}) == 0.0
    assert field_accuracy({"ok": True}, {"ok": True}) == 1.0


def test_parse_answer():
    assert parse_answer('{"a": 1}') == {"a": 1}
    assert parse_answer('{"a": 1') is None
    assert parse_answer("[" * 100000) is None
    assert not exact_match({}, {})  # nothing expected: nothing to match
