"""Constrained generation on the real model: every output the grammar completed is valid."""
from __future__ import annotations

import json
import re

import pytest

from bench.coverage import SUBSETS, load_schemas, run_coverage
from engine.protocol import FinishReason
from grammar.constraint import BOUNDED_JSON_WHITESPACE
from engine.sampling_params import SamplingParams
from grammar.constraint import Constraint

pytestmark = pytest.mark.slow

# bounded arrays: a small model can repeat items of an unbounded one until max_tokens (LENGTH, not success)
HAND_WRITTEN = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "array", "items": {"type": "string", "enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "score": {"type": "number"},
                                      "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4}},
     "required": ["ok", "score", "tags"]},
    {"type": "object", "properties": {"when": {"type": "string", "format": "date"}}, "required": ["when"]},
    {"type": "object", "properties": {"kind": {"const": "point"}, "x": {"type": "integer"}, "y": {"type": "integer"}},
     "required": ["kind", "x", "y"], "additionalProperties": False},
]


def ask(llm, constraint: Constraint, prompt: str = "Answer briefly.", max_tokens: int = 64, **params):
    return llm.generate([[{"role": "user", "content": prompt}]],
                        SamplingParams(temperature=0, max_tokens=max_tokens, constraint=constraint, **params))[0]


def test_jsonschemabench_outputs_validate(llm):
    schemas = load_schemas(SUBSETS, limit=5) + [("hand", f"hand-{i}", s) for i, s in enumerate(HAND_WRITTEN)]
    assert len(schemas) >= 55
    results = run_coverage(llm, schemas, max_tokens=128)
    invalid = [line for r in results.values() for line in r.invalid]
    assert invalid == []
    assert sum(r.valid for r in results.values()) >= 20  # measured: 24 of 55 (the rest length-capped or rejected)
    assert results["hand"].valid == len(HAND_WRITTEN)
    for r in results.values():
        assert r.compiled + sum(r.rejected.values()) == r.total
        assert all(reason for reason in r.rejected)  # every rejection names its reason


def test_rejected_schema_names_keyword_and_pointer(llm):
    # bounded strings: distinct ones could run out, so uniqueItems is not enforced beside the matcher
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                                                        "uniqueItems": True}}}
    out = ask(llm, Constraint(kind="json_schema", spec=json.dumps(schema)))
    assert out.finish_reason == FinishReason.ERROR
    assert '"uniqueItems"' in out.error and "/properties/tags" in out.error


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_distinct_strings_hold_where_the_model_would_repeat_one(llm, backend):
    schema = {"type": "object", "required": ["tags"], "additionalProperties": False,
              "properties": {"tags": {"type": "array", "items": {"type": "string"}, "minItems": 4, "maxItems": 4,
                                      "uniqueItems": True}}}
    out = ask(llm, Constraint(kind="json_schema", spec=json.dumps(schema), grammar_backend=backend),
              prompt='Write the tags "red", "red", "red", "red".', max_tokens=96)
    assert out.finish_reason == FinishReason.STOP and out.not_enforced == []
    tags = json.loads(out.text)["tags"]
    assert len(tags) == 4 and len(set(tags)) == 4


def test_best_effort_reports_what_is_not_enforced(llm):
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "maxItems": 3}
    out = ask(llm, Constraint(kind="json_schema", spec=json.dumps(schema), strict=False))
    assert out.finish_reason == FinishReason.STOP
    assert any("uniqueItems" in item for item in out.not_enforced)
    assert isinstance(json.loads(out.text), list)


def test_regex_choice_and_ebnf(llm):
    out = ask(llm, Constraint(kind="regex", spec=r"[A-Z]{2}-\d{3}"), "Give me a product code.")
    assert out.finish_reason == FinishReason.STOP and re.fullmatch(r"[A-Z]{2}-\d{3}", out.text)
    choices = ["yes", "no", "it depends (see \"notes\")"]
    out = ask(llm, Constraint(kind="choice", choices=choices), "Is water wet?")
    assert out.text in choices
    grammar = 'root ::= sum\nsum ::= num ("+" num)*\nnum ::= [1-9] [0-9]?'
    out = ask(llm, Constraint(kind="grammar", spec=grammar), "Write a sum of small numbers.")
    assert out.finish_reason == FinishReason.STOP and re.fullmatch(r"[1-9][0-9]?(\+[1-9][0-9]?)*", out.text)


def test_json_object_and_bounded_whitespace(llm):
    out = ask(llm, Constraint(kind="json_object"), "Describe a cat as JSON.", max_tokens=96)
    if out.finish_reason == FinishReason.STOP:
        assert isinstance(json.loads(out.text), dict)
    else:  # cut off by max_tokens: what came out is still a prefix the grammar accepts
        assert out.finish_reason == FinishReason.LENGTH
        backend = llm.engine.structured_output_manager.backend
        grammar = backend.make_grammar(backend.compile(Constraint(kind="json_object")))
        assert grammar.accept_tokens(list(out.token_ids))
    assert max_whitespace_gap(out.text) <= BOUNDED_JSON_WHITESPACE  # the default bounds every gap: no runaway


def max_whitespace_gap(text: str) -> int:
    """The longest run of whitespace between JSON tokens (outside strings)."""
    longest = run = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            escaped, in_string = (not escaped and char == "\\"), in_string and (escaped or char != '"')
            continue
        if char in " \t\r\n":
            run += 1
            longest = max(longest, run)
        else:
            run, in_string = 0, char == '"'
    return longest


def test_the_gap_measure():
    assert max_whitespace_gap('{"a": "x    y",\n  "b": 1}') == 3
    assert max_whitespace_gap('{"a":"\\"   "}') == 0


def test_mixed_batch_each_ends_correctly(llm_fp32):
    llm = llm_fp32  # float32: "unaffected" is checked token for token against each request alone
    schema = json.dumps(HAND_WRITTEN[0])
    conversations = [[{"role": "user", "content": p}] for p in
                     ["Who is Ada? JSON please.", "Tell me a joke.", "Bad schema here.", "Pick a code.", "Hi"]]
    params = [
        SamplingParams(temperature=0, max_tokens=48, constraint=Constraint(kind="json_schema", spec=schema)),
        SamplingParams(temperature=0, max_tokens=12),
        SamplingParams(temperature=0, max_tokens=12, constraint=Constraint(kind="regex", spec="[unclosed")),
        SamplingParams(temperature=0, max_tokens=12, constraint=Constraint(kind="regex", spec=r"\d{4}")),
        SamplingParams(temperature=0, max_tokens=12),
    ]
    alone = [llm.generate([c], p)[0] for c, p in zip(conversations, params)]
    batched = llm.generate(conversations, params)
    assert batched[2].finish_reason == FinishReason.ERROR and "regex" in batched[2].error
    assert json.loads(batched[0].text)["age"] >= 0
    assert re.fullmatch(r"\d{4}", batched[3].text)
    for a, b in zip(alone, batched):
        assert (a.text, a.finish_reason) == (b.text, b.finish_reason)


def test_jump_forward_saves_forward_passes_and_stays_valid(llm):
    schema = {"type": "object", "properties": {"first_name": {"type": "string"}, "last_name": {"type": "string"},
                                               "year_of_birth": {"type": "integer"}},
              "required": ["first_name", "last_name", "year_of_birth"], "additionalProperties": False}
    texts = ["Marie Curie was born in 1867 in Warsaw.", "Alan Turing, born 1912, was a mathematician.",
             "Grace Hopper (born 1906) wrote early compilers."]
    outs = {}
    for jf in (False, True):
        params = SamplingParams(temperature=0, max_tokens=64,
                                constraint=Constraint(kind="json_schema", spec=json.dumps(schema), jump_forward=jf))
        outs[jf] = llm.generate([[{"role": "user", "content": f"Extract the person as JSON: {t}"}] for t in texts],
                                [params] * len(texts))
    for off, on in zip(outs[False], outs[True]):
        for out in (off, on):
            assert out.finish_reason == FinishReason.STOP
            assert set(json.loads(out.text)) == set(schema["properties"])
        assert on.counters.num_forced_tokens > 0 and off.counters.num_forced_tokens == 0
        # the same document shape, keys in the schema's order (the values may differ: forced text is
        # the canonical tokenization, which the model without forcing need not have chosen)
        assert list(json.loads(on.text)) == list(json.loads(off.text)) == list(schema["properties"])
        assert on.counters.num_forward_passes < off.counters.num_forward_passes


def test_each_request_may_name_its_grammar_backend(llm):
    """llguidance through the whole engine: masks, jump-forward, closing early, not_enforced."""
    import jsonschema

    finished = 0
    for schema in HAND_WRITTEN:
        constraint = Constraint(kind="json_schema", spec=json.dumps(schema), grammar_backend="llguidance")
        out = ask(llm, constraint, "Answer as JSON.", max_tokens=96)
        assert out.finish_reason in (FinishReason.STOP, FinishReason.LENGTH), out.error
        if out.finish_reason == FinishReason.STOP:
            jsonschema.validate(json.loads(out.text), schema)
            finished += 1
    assert finished >= 3
    out = ask(llm, Constraint(kind="regex", spec=r"[A-Z]{2}-\d{3}", grammar_backend="llguidance"), "A product code.")
    assert out.finish_reason == FinishReason.STOP and re.fullmatch(r"[A-Z]{2}-\d{3}", out.text)
    report = llm.engine.validate_constraint(Constraint(kind="json_schema", spec='{"type": "number", "multipleOf": 0.5}',
                                                       grammar_backend="auto"))
    assert report.ok and report.backend == "llguidance"  # auto: xgrammar does not enforce that multipleOf
