"""`formwork bench accuracy`'s scoring per item and its paired comparison with a baseline run."""
from __future__ import annotations

import pytest

from bench.accuracy import Item, paired_differences, score_answers

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
          "required": ["a", "b"]}


def items(count: int) -> list[Item]:
    return [Item("person", f"p{i}", SCHEMA, {"a": i, "b": "x"}, {}) for i in range(count)]


def rows_for(answers: list[str]) -> list[dict]:
    scored = score_answers("formwork", "bounded", items(len(answers)),
                           [(text, "stop", 5) for text in answers])
    return [row.as_dict() for row in scored]


def test_each_item_keeps_its_score():
    (row,) = rows_for(['{"a": 0, "b": "x"}', '{"a": 7, "b": "x"}', '{"a": 2'])
    assert row["item_scores"] == {"p0": 1.0, "p1": 0.5, "p2": 0.0}  # the last is not JSON: scores 0
    assert row["field_accuracy"] == pytest.approx(0.5)


def test_differences_are_paired_by_item_with_their_standard_error():
    baseline = rows_for(['{"a": 0, "b": "x"}', '{"a": 1, "b": "y"}', '{"a": 9, "b": "x"}', '{"a": 3, "b": "x"}'])
    rows = rows_for(['{"a": 0, "b": "x"}', '{"a": 1, "b": "x"}', '{"a": 9, "b": "y"}', '{"a": 3, "b": "x"}'])
    (c,) = paired_differences(rows, baseline)
    # per item: 0, +0.5, -0.5, 0 -> mean 0, stdev sqrt(1/6), over sqrt(4)
    assert (c["items"], c["better"], c["worse"]) == (4, 1, 1)
    assert c["difference"] == pytest.approx(0.0)
    assert c["standard_error"] == pytest.approx((1 / 6) ** 0.5 / 2)
    other_setting = [dict(r, setting="compact") for r in baseline]
    assert paired_differences(rows, other_setting) == []  # nothing of the same setting to compare
