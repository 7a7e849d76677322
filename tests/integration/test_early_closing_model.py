"""Closing early on the real model and real schemas: every answer completes and validates."""
from __future__ import annotations

import json

import jsonschema
import pytest

from bench.coverage import SUBSETS, load_schemas, run_coverage
from bench.workloads import extraction_prompt, load_json_extraction
from engine.protocol import FinishReason
from engine.sampling_params import SamplingParams
from grammar.backend import Grammar
from grammar.constraint import Constraint
from grammar.xgrammar.matcher import XGrammarGrammar


# Snowplow's first schemas take over a minute to compile here; JsonSchemaStore's first has a string
# `pattern` that needs a backslash, which xgrammar matches against the raw JSON text: no output is
# both JSON and the pattern's (docs/constraints.md, Closing early)
SAMPLED = [s for s in SUBSETS if s not in ("Snowplow", "JsonSchemaStore")]


def _check(results, max_length_capped: int = 0):
    invalid = [line for r in results.values() for line in r.invalid]
    assert invalid == []
    assert sum(r.length_capped for r in results.values()) <= max_length_capped  # closed instead of cut
    assert sum(r.valid for r in results.values()) + sum(r.length_capped for r in results.values()) == sum(
        r.compiled for r in results.values())


def test_one_schema_per_subset_always_completes(llm):
    # max_tokens 96: short enough that most answers need closing (by budget or a loop)
    results = run_coverage(llm, load_schemas(SAMPLED, limit=1), max_tokens=96)
    _check(results)
    assert sum(sum(r.closed_early.values()) for r in results.values()) >= 1


def _extract(llm, items: list[dict], max_tokens: int, grammar_backend: str = ""):
    params = [SamplingParams(temperature=0, max_tokens=max_tokens,
                             constraint=Constraint(kind="json_schema", spec=json.dumps(item["schema"]),
                                                   grammar_backend=grammar_backend))
              for item in items]
    return llm.generate([extraction_prompt(item) for item in items], params)


def _count_searches(monkeypatch) -> list[int]:
    """Record each closing search a step makes (the compile's own, with a larger budget, aside)."""
    searched: list[int] = []
    search = XGrammarGrammar.closing_token_ids

    def counted(self, max_tokens, first_fills=None, **budget):
        if not budget:
            searched.append(max_tokens)
        return search(self, max_tokens, first_fills, **budget)

    monkeypatch.setattr(XGrammarGrammar, "closing_token_ids", counted)
    return searched


def test_json_extraction_answers_always_complete(llm, monkeypatch):
    items = load_json_extraction()[:8]
    searched = _count_searches(monkeypatch)
    with monkeypatch.context() as without_recheck:  # every check in the last stretch searches
        without_recheck.setattr(XGrammarGrammar, "completes", Grammar.completes)
        searching = _extract(llm, items, max_tokens=64, grammar_backend="xgrammar")  # the recheck counted is its
    num_searching = len(searched)
    outs = _extract(llm, items, max_tokens=64, grammar_backend="xgrammar")  # 64: below what most answers need
    for item, out in zip(items, outs):
        assert out.finish_reason == FinishReason.STOP, (item["id"], out.text)
        jsonschema.validate(json.loads(out.text), item["schema"])
    # rechecking the last closing found closes at the same points, with fewer searches
    assert [(o.text, o.closed_early) for o in outs] == [(o.text, o.closed_early) for o in searching]
    assert sum(bool(o.closed_early) for o in outs) >= 4
    assert len(searched) - num_searching < num_searching * 2 / 3


@pytest.mark.slow
@pytest.mark.benchmark  # the two tests above check the same on a schema per subset and 8 extractions
def test_jsonschemabench_sample_and_json_extraction_always_complete(llm):
    subsets = [s for s in SUBSETS if s != "Snowplow"]
    # measured: 1 of 19 compiled length-capped at max_tokens 512, limit 3 (the pattern string above)
    _check(run_coverage(llm, load_schemas(subsets, limit=3), max_tokens=512), max_length_capped=1)
    items = load_json_extraction()
    for item, out in zip(items, _extract(llm, items, max_tokens=256)):
        assert out.finish_reason == FinishReason.STOP, (item["id"], out.text)
        jsonschema.validate(json.loads(out.text), item["schema"])
