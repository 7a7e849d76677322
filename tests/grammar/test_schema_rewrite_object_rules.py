"""The rewrite's `if`/`then`/`else`, `propertyNames` and `unevaluatedProperties` rules: the same
verdicts as the original (jsonschema the reference), hand-computed where short, refused where
no exact form is written, and enforced strict by both backends."""
from __future__ import annotations

import itertools
import json

import jsonschema
import pytest
from grammar_factories import accepted_by, make_backend, make_constraint, make_llguidance_backend

from grammar.json_schema.merge import merge
from grammar.json_schema.rewrite import rewrite
from grammar.xgrammar.schema_gaps import ENFORCED_FORMATS, find_unsupported

CLOSED = {"type": "object", "additionalProperties": False}
# a discriminator decides the condition: kind "a" needs x, any other kind needs y
DISCRIMINATED = {**CLOSED, "properties": {"kind": {"enum": ["a", "b"]}, "x": {"type": "integer"},
                                          "y": {"type": "string"}},
                 "required": ["kind"], "if": {"properties": {"kind": {"const": "a"}}},
                 "then": {"required": ["x"]}, "else": {"required": ["y"]}}
SCHEMAS = {
    "discriminated": DISCRIMINATED,
    "required decides": {**CLOSED, "properties": {"p": {"type": "string"}, "q": {"type": "integer"}},
                         "if": {"required": ["p"]}, "then": {"required": ["q"]}},
    "type decides": {"type": ["string", "integer"], "if": {"type": "string"}, "then": {"maxLength": 2},
                     "else": {"minimum": 0}},
    "referenced sides": {**CLOSED, "$defs": {"needs_x": {"required": ["x"]}},
                         "properties": {"kind": {"enum": ["a", "b"]}, "x": {"type": "integer"}},
                         "allOf": [{"if": {"properties": {"kind": {"const": "a"}}},
                                    "then": {"$ref": "#/$defs/needs_x"}}]},
    "names in a closed object": {**CLOSED, "properties": {"ab": {}, "abc": {}, "d": {}},
                                 "propertyNames": {"maxLength": 2}},
    "names of a type": {"type": "object", "propertyNames": {"type": "string", "description": "any"}},
    "no names": {"type": "object", "propertyNames": False},
    "unevaluated beside additionalProperties": {
        "type": "object", "$defs": {"base": {"type": "object", "properties": {"a": {"type": "integer"}},
                                             "additionalProperties": True}},
        "allOf": [{"$ref": "#/$defs/base"}, {"properties": {"b": {"type": "string"}}}],
        "unevaluatedProperties": False},
    "unevaluated alone": {"type": "object", "properties": {"a": {"type": "integer"}},
                          "unevaluatedProperties": {"type": "string"}},
}
KEYS = ("kind", "x", "y", "p", "q", "a", "b", "ab", "abc", "d", "zz")
VALUES = ("a", "b", "c", 1, -1, "xyz", None)


def _instances() -> list:
    """Objects of up to two of KEYS with VALUES, and the VALUES themselves."""
    objects = [dict(zip(names, values)) for n in range(3) for names in itertools.combinations(KEYS, n)
               for values in itertools.product(VALUES, repeat=n)]
    return [*objects, *VALUES, [], "ab"]


@pytest.mark.parametrize("name", SCHEMAS)
def test_written_out_with_the_same_verdicts(name):
    schema = SCHEMAS[name]
    result = rewrite(schema, ENFORCED_FORMATS)
    assert find_unsupported(result.schema) == []
    original, rewritten = jsonschema.Draft202012Validator(schema), jsonschema.Draft202012Validator(result.schema)
    for instance in _instances():
        assert rewritten.is_valid(instance) == original.is_valid(instance), instance


def test_a_discriminated_condition_hand_computed():
    result = rewrite(DISCRIMINATED, ENFORCED_FORMATS)
    assert result.rules["if"] == 1 and result.narrowed == []
    properties = DISCRIMINATED["properties"]
    assert result.schema == {"anyOf": [
        {**CLOSED, "properties": {**properties, "kind": {"enum": ["a"]}}, "required": ["kind", "x"]},
        {**CLOSED, "properties": {**properties, "kind": {"enum": ["b"]}}, "required": ["kind", "y"]}]}


def test_a_conditional_is_written_without_narrowing_its_sides():
    # else's required does not become an object type: a string shorter than 2 needs nothing
    schema = {"if": {"minLength": 2}, "then": {"type": "string"}, "else": {"required": ["a"]}}
    result = rewrite(schema, ENFORCED_FORMATS)
    assert result.schema == {"anyOf": [{"minLength": 2, "type": "string"},
                                       {"not": {"minLength": 2}, "required": ["a"]}]}
    assert result.narrowed == []


def test_property_names_hand_computed():
    assert rewrite(SCHEMAS["names in a closed object"], ENFORCED_FORMATS).schema == {
        **CLOSED, "properties": {"ab": {}, "d": {}}}
    assert rewrite(SCHEMAS["names of a type"], ENFORCED_FORMATS).schema == {"type": "object"}
    assert rewrite(SCHEMAS["no names"], ENFORCED_FORMATS).schema == {"type": "object", "maxProperties": 0}


def test_unevaluated_properties_hand_computed():
    assert rewrite(SCHEMAS["unevaluated alone"], ENFORCED_FORMATS).schema == {
        "type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}}
    result = rewrite(SCHEMAS["unevaluated beside additionalProperties"], ENFORCED_FORMATS)
    assert "unevaluatedProperties" not in json.dumps(result.schema)


@pytest.mark.parametrize("schema, keyword", [
    # names of an open object: a pattern over names nobody declared (xgrammar enforces it, llguidance
    # does not)
    ({"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}, "propertyNames"),
    # which properties an anyOf evaluates depends on the branch that holds
    ({"type": "object", "anyOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}],
      "unevaluatedProperties": False}, "unevaluatedProperties"),
])
def test_otherwise_stays_for_the_checker(schema, keyword):
    result = rewrite(schema, ENFORCED_FORMATS)
    assert result.rules[keyword] == 0
    assert f'"{keyword}"' in json.dumps(result.schema)


def test_a_condition_without_a_written_complement_stays_a_refused_not():
    # not "starts with a": no complement is written for a general pattern
    schema = {"type": "string", "if": {"pattern": "^a"}, "then": {"maxLength": 3}}
    result = rewrite(schema, ENFORCED_FORMATS)
    # (the length folded into the pattern by another rule)
    assert result.schema == {"anyOf": [{"type": "string", "pattern": "^a.{0,2}$"},
                                       {"type": "string", "not": {"pattern": "^a"}}]}
    assert "not" in [f.keyword for f in find_unsupported(result.schema)]


def test_a_schema_merged_with_itself_is_itself_references_included():
    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}}
    assert merge(schema, json.loads(json.dumps(schema))) == schema


@pytest.mark.parametrize("name", ["discriminated", "required decides", "referenced sides",
                                  "names in a closed object", "unevaluated alone"])
@pytest.mark.parametrize("make", [make_backend, make_llguidance_backend], ids=["xgrammar", "llguidance"])
def test_both_backends_enforce_it_strict(name, make):
    schema, backend = SCHEMAS[name], make()
    compiled = backend.compile(make_constraint(spec=schema, whitespace="compact"))
    validator = jsonschema.Draft202012Validator(schema)
    # objects only, keys in the order the schema declares them (both backends keep that order)
    order = list(schema.get("properties", {}))
    verdicts = set()
    for instance in _instances():
        if not isinstance(instance, dict) or any(k not in order for k in instance):
            continue
        ordered = {k: instance[k] for k in order if k in instance}
        text = json.dumps(ordered, separators=(",", ":"))
        verdicts.add(validator.is_valid(ordered))
        assert accepted_by(backend, compiled, text) == validator.is_valid(ordered), ordered
    assert verdicts == {True, False}
