"""Constraints whose closing is hard to find, closed from inside a loop and on the real model at a
max_tokens just above the shortest output: every answer completes and validates."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
from grammar_factories import decode, encode, make_backend, make_constraint

from engine.protocol import FinishReason
from engine.sampling_params import SamplingParams
from grammar.constraint import Constraint


def _required(properties: dict) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties)}


PATH = r"\w+/(\w+\.)*\w+\.dll"  # a way out that is a word: `.dll` after a run of letters
# (name, schema, a prefix the output may have reached when it must close)
SCHEMAS = [
    ("path", _required({"assembly": {"type": "string", "pattern": PATH}}), '{"assembly":"System'),
    ("suffix after a class", _required({"file": {"type": "string", "pattern": r"^[a-z]+-v[0-9]+\.json$"}}),
     '{"file":"schema'),
    ("optional tail", _required({"phone": {"type": "string", "pattern": r"^\d{3}-\d{4}( ext\. \d+)?$"}}),
     '{"phone":"555-01'),
    ("e-mail domain", _required({"mail": {"type": "string", "pattern": r"^[^@\s]+@example\.(com|org)$"}}),
     '{"mail":"grace'),
    ("nested required objects", _required({"a": _required({"b": _required({"c": _required({
        "d": {"type": "string"}, "e": {"type": "integer"}})})}), "f": {"type": "boolean"}}), '{"a":{"b":'),
    ("minItems of objects", _required({"points": {"type": "array", "minItems": 3, "items": _required({
        "x": {"type": "integer"}, "y": {"type": "integer"}})}}), '{"points":[{"x":1,'),
    ("minLength", _required({"summary": {"type": "string", "minLength": 40}}), '{"summary":"It'),
    ("bounded numbers", _required({"year": {"type": "integer", "minimum": 1900, "maximum": 1999},
                                   "ratio": {"type": "number", "exclusiveMinimum": 0.5, "maximum": 0.75}}),
     '{"year":19'),
    ("enum of long strings", _required({"verdict": {"enum": [
        "the application was approved after a second review",
        "the application was rejected after a second review"]}}), '{"verdict":"the application'),
    # formats whose value needs a particular character: the `@` and a domain, the `::`
    ("email format", _required({"emails": {"type": "array", "minItems": 1, "items": {
        "type": "string", "format": "email"}}}), '{"emails":["ada.lovelace'),
    ("ipv6 format", _required({"address": {"type": "string", "format": "ipv6"}}), '{"address":"'),
]
# (kind, spec, a prefix, the regex the output must match)
OTHER_KINDS = [
    ("regex", r"\w+\.dll", "kernel32", r"\w+\.dll"),
    ("regex", r"[A-Z][a-z]+ (Inc|Corporation)\.", "Acme", r"[A-Z][a-z]+ (Inc|Corporation)\."),
    ("grammar", 'root ::= ([a-z]+ " ")+ "the end."', "once upon a ", r"([a-z]+ )+the end\."),
]


def _close(grammar, max_tokens: int = 256) -> str:
    closing = grammar.closing_token_ids(max_tokens)
    assert closing is not None, "no closing found"
    assert grammar.accept_tokens(closing) and grammar.is_terminated()
    stop_ids = set(make_backend().stop_token_ids)
    return decode([t for t in closing if t not in stop_ids])


@pytest.mark.parametrize("name, schema, prefix", SCHEMAS, ids=[case[0] for case in SCHEMAS])
def test_a_schema_closes_from_inside_its_loop(name, schema, prefix):
    backend = make_backend()
    compiled = backend.compile(make_constraint("json_schema", schema, whitespace="compact"))
    assert compiled.min_output_tokens is not None  # the shortest output was found at compile time
    grammar = backend.make_grammar(compiled)
    assert grammar.accept_tokens(encode(prefix))
    jsonschema.validate(json.loads(prefix + _close(grammar)), schema)


@pytest.mark.parametrize("kind, spec, prefix, pattern", OTHER_KINDS)
def test_a_regex_or_grammar_closes_from_inside_its_loop(kind, spec, prefix, pattern):
    backend = make_backend()
    grammar = backend.make_grammar(backend.compile(make_constraint(kind, spec)))
    assert grammar.accept_tokens(encode(prefix))
    assert re.fullmatch(pattern, prefix + _close(grammar))


def test_the_closing_is_the_shortest_way_out_of_the_path():
    backend = make_backend()
    grammar = backend.make_grammar(backend.compile(make_constraint("json_schema", SCHEMAS[0][1],
                                                                   whitespace="compact")))
    assert grammar.accept_tokens(encode('{"assembly":"System'))
    assert _close(grammar) == '/a.dll"}'


def test_a_pattern_that_needs_a_backslash_closes_into_json_whose_value_matches_it():
    # xgrammar matches a pattern against the JSON text: it gets the pattern's JSON-text form
    # (`[\\]` becomes the two characters `\\`), so the closing writes the backslash escaped
    schema = _required({"assembly": {"type": "string", "pattern": r"\w+[\\](\w+\.)*\w+\.dll"}})
    backend = make_backend()
    grammar = backend.make_grammar(backend.compile(make_constraint("json_schema", schema, whitespace="compact")))
    assert grammar.accept_tokens(encode('{"assembly":"System'))
    value = json.loads('{"assembly":"System' + _close(grammar))
    jsonschema.validate(value, schema)
    assert re.fullmatch(r"System\w*\\(\w+\.)*\w+\.dll", value["assembly"])


def test_a_plain_string_still_closes_with_its_quote():
    # the pattern's words fit inside any string too: they must not come before the quote
    schema = _required({"name": {"type": "string"}, "assembly": {"type": "string", "pattern": PATH}})
    backend = make_backend()
    grammar = backend.make_grammar(backend.compile(make_constraint("json_schema", schema, whitespace="compact")))
    assert grammar.accept_tokens(encode('{"name":"Grace'))
    closing = _close(grammar)
    assert closing.startswith('","assembly":"') and closing.endswith('/a.dll"}')
    jsonschema.validate(json.loads('{"name":"Grace' + closing), schema)


def _cases() -> list[tuple[Constraint, object]]:
    """(constraint, its JSON Schema or the regex its output must match)."""
    return ([(Constraint("json_schema", json.dumps(schema)), schema) for _, schema, _ in SCHEMAS]
            + [(Constraint(kind, spec), pattern) for kind, spec, _, pattern in OTHER_KINDS])


def test_every_answer_completes_just_above_the_shortest_output(llm):
    cases = _cases()
    backend = make_backend()
    minimums = [backend.compile(constraint).min_output_tokens for constraint, _ in cases]
    assert None not in minimums
    runs = [(constraint, shape, minimum + extra) for (constraint, shape), minimum in zip(cases, minimums)
            for extra in (1, 4)]
    prompts = [[{"role": "user", "content": "Write one realistic example that fits: " + constraint.spec}]
               for constraint, _, _ in runs]
    params = [SamplingParams(temperature=0, max_tokens=max_tokens, constraint=constraint)
              for constraint, _, max_tokens in runs]
    failed = []
    for (constraint, shape, max_tokens), out in zip(runs, llm.generate(prompts, params)):
        if out.finish_reason != FinishReason.STOP:
            failed.append((constraint.spec, max_tokens, out.text))
        elif isinstance(shape, str):
            assert re.fullmatch(shape, out.text)
        else:
            jsonschema.validate(json.loads(out.text), shape)
    assert failed == []
