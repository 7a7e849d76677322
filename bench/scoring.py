"""How an answer is scored against the expected one: field accuracy and exact match.

A field is right when the answer's value equals the expected value (JSON equality: 250 == 250.0,
strings exactly, arrays in order). An answer that is not a JSON object, or that did not parse,
scores 0 on every field.
"""
from __future__ import annotations

import json
from typing import Any


def parse_answer(text: str) -> Any:
    """The JSON value of `text`, or None when it does not parse."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def field_accuracy(expected: dict, got: Any) -> float:
    """The share of the expected fields the answer got right."""
    if not isinstance(got, dict):
        return 0.0
    return sum(1 for key, value in expected.items() if key in got and _equal(got[key], value)) / max(len(expected), 1)


def exact_match(expected: dict, got: Any) -> bool:
    """Every expected field right (extra fields in the answer do not count against it)."""
    return isinstance(got, dict) and bool(expected) and field_accuracy(expected, got) == 1.0


def _equal(got: Any, expected: Any) -> bool:
    if isinstance(got, bool) or isinstance(expected, bool):
        return type(got) is type(expected) and got == expected  # True is not 1
    return got == expected
