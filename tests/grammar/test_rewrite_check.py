"""The schema rewrite never admits an instance the original schema rejects (checked with jsonschema):
the JSON-Schema test suite's instances at schema level, and (with the real tokenizer) instances
sampled from the compiled grammars of the carried JSONSchemaBench sample, and their mutations."""
from __future__ import annotations

import json
import random

import pytest

from rewrite_sampling import (CheckResult, GrammarSampler, check_schema, ecma_dollar, is_multiple, mutations, report,
                              validator)

from bench.coverage import load_schemas
from bench.datasets import SUBSETS, TEST_SUITE_DIR
from grammar.backend import GrammarError
from grammar.json_schema.rewrite import rewrite
from grammar.xgrammar.schema_gaps import ENFORCED_FORMATS

jsonschema = pytest.importorskip("jsonschema")


def _suite_groups():
    for path in sorted(TEST_SUITE_DIR.glob("*.json")):
        for group in json.loads(path.read_text()):
            yield path.stem, group


def test_no_suite_instance_is_admitted_by_the_rewrite_that_the_original_rejects():
    looser, num_checked, num_rewritten = [], 0, 0
    for name, group in _suite_groups():
        try:
            new_schema = rewrite(group["schema"], ENFORCED_FORMATS).schema
        except GrammarError:
            continue  # refused with a reason: nothing admitted
        if new_schema == group["schema"]:
            continue
        num_rewritten += 1
        try:
            original, new = validator(group["schema"]), validator(new_schema)
            verdicts = [(t["data"], original.is_valid(t["data"]), new.is_valid(t["data"])) for t in group["tests"]]
        except Exception:  # remote references and the like: jsonschema cannot judge them offline
            continue
        for data, ok_original, ok_new in verdicts:
            num_checked += 1
            if ok_new and not ok_original:
                looser.append(f"{name} / {group['description']}: {json.dumps(data)}")
    assert num_rewritten > 50 and num_checked > 150  # the check saw real work
    assert looser == []


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3},
                                      "b": {"allOf": [{"type": "integer"}, {"minimum": 2}]}},
     "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"r": {"type": "number"}, "l": {"type": "number"}, "w": {"type": "number"}},
     "oneOf": [{"required": ["r"]}, {"required": ["l", "w"]}]},
    {"type": "object", "properties": {"a": {}, "b": {}}, "dependentRequired": {"a": ["b"]}},
])
def test_mutations_of_valid_instances_never_pass_the_rewrite_alone(schema):
    rng = random.Random(0)
    original, new = validator(schema), validator(rewrite(schema, ENFORCED_FORMATS).schema)
    seeds = [{"a": "abc", "b": 3}, {"r": 1}, {"l": 1, "w": 2}, {"a": 1, "b": 2}, {"b": 1}]
    instances = [m for seed in seeds for m in [seed, *mutations(seed, rng)]]
    assert len(instances) > 50
    assert [x for x in instances if new.is_valid(x) and not original.is_valid(x)] == []


def test_dollar_is_the_end_of_the_string_as_in_ecma_262():
    assert ecma_dollar("^a$[$]") == "^a\\Z[$]"
    v = validator({"type": "string", "pattern": "^ab$"})
    assert v.is_valid("ab") and not v.is_valid("ab\n")


def test_multiple_of_is_judged_on_the_decimal_text_not_by_float_division():
    assert 0.07 / 0.01 != 7  # why: jsonschema's own check calls 0.07 no multiple of 0.01
    assert is_multiple(0.07, 0.01) and is_multiple(12.34, 0.01) and is_multiple(3, 0.01) and is_multiple(1e20, 0.01)
    assert not is_multiple(0.075, 0.01) and not is_multiple(7, 2) and not is_multiple(float("inf"), 0.01)
    assert validator({"multipleOf": 0.01}).is_valid(0.07)
    assert not validator({"multipleOf": 0.01}).is_valid(0.071)


def _check_sample(subsets, limit: int, num_samples: int) -> CheckResult:
    from grammar_factories import make_backend

    backend = make_backend()
    sampler, rng, result = GrammarSampler(backend), random.Random(0), CheckResult()
    for subset, sid, schema in load_schemas(list(subsets), limit):
        check_schema(backend, sampler, f"{subset}/{sid}", schema, result, rng, num_samples)
    print(report(result))
    return result


def test_grammar_samples_of_a_few_rewritten_schemas_are_never_looser_than_the_original():
    result = _check_sample(["Github_trivial", "Glaiveai2K", "Kubernetes"], limit=4, num_samples=3)
    assert result.num_rewritten >= 3 and result.num_sampled > 0  # the check saw real work
    assert result.looser == []


@pytest.mark.benchmark  # the test above checks the same on a few schemas; -s prints the figures
def test_grammar_samples_of_the_whole_sample_are_never_looser_than_the_original():
    subsets = [s for s in SUBSETS if s != "Snowplow"]  # its compiles take minutes here
    result = _check_sample(subsets, limit=50, num_samples=6)
    assert result.num_rewritten > 100
    assert result.looser == []
