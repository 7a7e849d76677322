"""bench/compile_coverage.py: the compile-only coverage run's order, time limit and resumable records."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from bench.compile_coverage import compile_formwork, interleaved
from grammar.config import GrammarConfig


def test_subsets_take_turns_so_a_stopped_run_has_measured_each():
    schemas = [("a", "a1", {}), ("a", "a2", {}), ("a", "a3", {}), ("b", "b1", {}), ("c", "c1", {}), ("c", "c2", {})]
    assert [sid for _, sid, _ in interleaved(schemas)] == ["a1", "b1", "c1", "a2", "c2", "a3"]


# each word-count pattern makes xgrammar build a rule per counted repeat: seconds per 100 repeats,
# so these take minutes (killed at the limit)
_SLOW = {"type": "object", "required": [f"p{i}" for i in range(16)], "additionalProperties": False,
         "properties": {f"p{i}": {"type": "string", "pattern": "^(?:\\S+\\s+){0,999}\\S+$"} for i in range(16)}}


@pytest.mark.slow  # three compile processes load the tokenizer
def test_a_compile_past_the_limit_is_refused_and_the_next_schema_still_compiles(model_dir, tmp_path):
    records = tmp_path / "records.jsonl"
    # a record already there is counted, not compiled again: this one says a schema that cannot
    # compile did (a resumed run trusts what it measured before)
    records.write_text(json.dumps({"subset": "s", "id": "done", "ok": True, "reason": "", "compile_s": 0.5}) + "\n")
    schemas = [("s", "slow", _SLOW), ("s", "small", {"type": "integer"}), ("s", "done", {"type": "nothing"}),
               ("s", "bad", {"type": "array", "uniqueItems": True, "items": {"type": "string", "maxLength": 8}})]
    # xgrammar: auto starts a schema on llguidance, which compiles _SLOW in ms
    config = SimpleNamespace(model=str(model_dir), grammar=GrammarConfig(compile_timeout_s=2.0,
                                                                         grammar_backend="xgrammar"))
    tally = compile_formwork(schemas, config, str(records))["s"]
    assert (tally.total, tally.compiled) == (4, 2)
    assert tally.rejected == {"compile time limit": 1, 'unsupported "uniqueItems"': 1}
    written = [json.loads(line) for line in records.read_text().splitlines()]
    assert [(r["id"], r["ok"]) for r in written] == [("done", True), ("slow", False), ("small", True), ("bad", False)]
