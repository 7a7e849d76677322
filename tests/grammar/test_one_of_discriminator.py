"""A oneOf of object branches told apart by a property each declares with an enum or const (a
tagged union), when no exact rule applies: the branches with that property required, as an
anyOf (a narrowing: instances without it are dropped). Never looser than the oneOf (jsonschema the
reference), the same verdict on every instance that has the tag, and enforced strict by both
backends."""
from __future__ import annotations

import json

import jsonschema
import pytest
from grammar_factories import accepted_by, make_backend, make_constraint, make_llguidance_backend

from grammar.json_schema.rewrite import rewrite
from grammar.xgrammar.schema_gaps import ENFORCED_FORMATS

WORD = {"type": "string", "pattern": "^[a-z]+$"}
TAGGED = {"oneOf": [
    {"type": "object", "properties": {"kind": {"const": "word"}, "text": WORD}, "required": ["text"],
     "additionalProperties": False},
    {"type": "object", "properties": {"kind": {"enum": ["any", "free"]}, "text": {"type": "string"}},
     "required": ["text"], "additionalProperties": False}]}
REFERENCED = {"$defs": {"A": TAGGED["oneOf"][0], "B": TAGGED["oneOf"][1]},
              "oneOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}]}
# in declared property order
INSTANCES = [{"kind": "word", "text": "abc"}, {"kind": "word", "text": "A1"}, {"kind": "any", "text": "A1"},
             {"kind": "free", "text": "abc"}, {"kind": "other", "text": "abc"}, {"text": "abc"}, {"text": "A1"},
             {"kind": "word"}, {}]


@pytest.mark.parametrize("schema", [TAGGED, REFERENCED], ids=["inline", "referenced"])
def test_the_tag_is_required_and_nothing_looser_is_admitted(schema):
    result = rewrite(schema, ENFORCED_FORMATS)
    assert "oneOf" not in result.schema and result.narrowed == ["oneOf-discriminator at /"]
    assert [b["required"] for b in result.schema["anyOf"]] == [["text", "kind"], ["text", "kind"]]
    original, rewritten = jsonschema.Draft202012Validator(schema), jsonschema.Draft202012Validator(result.schema)
    for instance in INSTANCES:
        if "kind" in instance:
            assert rewritten.is_valid(instance) == original.is_valid(instance), instance
        elif rewritten.is_valid(instance):
            assert original.is_valid(instance), instance
    # what the narrowing drops: {"text": "A1"} was valid against the second branch alone
    assert original.is_valid({"text": "A1"}) and not rewritten.is_valid({"text": "A1"})


@pytest.mark.parametrize("one_of", [
    # a value the branches share: not a discriminator
    [{"type": "object", "properties": {"k": {"enum": ["a", "b"]}, "t": WORD}},
     {"type": "object", "properties": {"k": {"const": "b"}, "t": {"type": "string"}}}],
    # an untyped branch: a non-object instance is valid against both whatever is required
    [{"properties": {"k": {"const": "a"}, "t": WORD}}, {"type": "object", "properties": {"k": {"const": "b"}}}],
])
def test_no_discriminator_no_rewrite(one_of):
    assert "oneOf-discriminator" not in rewrite({"oneOf": one_of}, ENFORCED_FORMATS).rules


def test_not_where_narrowing_could_widen():
    schema = {"not": TAGGED}
    assert "oneOf-discriminator" not in rewrite(schema, ENFORCED_FORMATS).rules


@pytest.mark.parametrize("make", [make_backend, make_llguidance_backend], ids=["xgrammar", "llguidance"])
def test_both_backends_enforce_it_strict(make):
    backend = make()
    compiled = backend.compile(make_constraint(spec=TAGGED, whitespace="spaced"))
    rewritten = jsonschema.Draft202012Validator(rewrite(TAGGED, ENFORCED_FORMATS).schema)
    for instance in INSTANCES:
        assert accepted_by(backend, compiled, json.dumps(instance)) == rewritten.is_valid(instance), instance


# the tag one level down: "meta" is declared by both, optional, and its schema requires a "system"
# of an enum of its own in each branch; with "meta" required the branches are disjoint
NESTED = {"type": "object", "required": ["items"], "oneOf": [
    {"properties": {"meta": {"type": "object", "required": ["system"], "properties": {"system": {"enum": ["apt"]}}},
                    "items": {"type": "array", "items": {"type": "string"}}}},
    {"properties": {"meta": {"type": "object", "required": ["system"], "properties": {"system": {"enum": ["yum"]}}},
                    "items": {"type": "array", "items": {"type": "integer"}}}}]}
NESTED_INSTANCES = [{"meta": {"system": s}, "items": i} for s in ("apt", "yum", "dnf") for i in ([], ["a"], [1])] + [
    {"items": []}, {"items": ["a"]}, {"meta": {}, "items": []}]


def test_a_property_that_required_makes_the_branches_disjoint_is_the_tag():
    result = rewrite(NESTED, ENFORCED_FORMATS)
    assert "oneOf" not in result.schema and result.narrowed == ["oneOf-discriminator at /"]
    assert [b["required"] for b in result.schema["anyOf"]] == [["items", "meta"], ["items", "meta"]]
    original, rewritten = jsonschema.Draft202012Validator(NESTED), jsonschema.Draft202012Validator(result.schema)
    for instance in NESTED_INSTANCES:
        if "meta" in instance:
            assert rewritten.is_valid(instance) == original.is_valid(instance), instance
        else:
            assert not rewritten.is_valid(instance), instance  # dropped: the narrowing
    # {"items": []} is valid against both branches, so not against the oneOf: nothing looser
    assert not original.is_valid({"items": []})


@pytest.mark.parametrize("make", [make_backend, make_llguidance_backend], ids=["xgrammar", "llguidance"])
def test_a_nested_tag_is_enforced_strict_by_both_backends(make):
    backend = make()
    compiled = backend.compile(make_constraint(spec=NESTED, whitespace="compact"))
    validator = jsonschema.Draft202012Validator(NESTED)
    for instance in NESTED_INSTANCES:
        ordered = {k: instance[k] for k in ("meta", "items") if k in instance}
        if "meta" in ordered:
            text = json.dumps(ordered, separators=(",", ":"))
            assert accepted_by(backend, compiled, text) == validator.is_valid(ordered), text
