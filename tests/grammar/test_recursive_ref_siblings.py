"""Keywords beside a `$ref` whose target refers back to itself with the same keywords beside it
(or to the root, "#"): a definition of their own, the same verdict as the original on every
instance tried (jsonschema the reference), enforced strict by both backends."""
from __future__ import annotations

import json

import jsonschema
import pytest
from grammar_factories import accepted_by, make_backend, make_constraint, make_llguidance_backend

from grammar.json_schema.rewrite import rewrite
from grammar.json_schema.rule import asserting
from grammar.json_schema.walk import iter_subschemas
from grammar.xgrammar.schema_gaps import ENFORCED_FORMATS

NODE = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 4},
    "kids": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/node", "required": ["name"]}}}}
TREE = {"$defs": {"node": NODE}, "$ref": "#/$defs/node"}
# the same tree with the root as the definition
ROOT_TREE = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 4},
    "kids": {"type": "array", "maxItems": 2, "items": {"$ref": "#", "required": ["name"]}}}}
# instances in the declared property order, as the grammars write them
INSTANCES = [{}, {"name": "a"}, {"name": "a", "kids": [{"name": "b"}]}, {"kids": [{}]}, {"kids": [{"name": "b"}]},
             {"name": "a", "kids": [{"name": "b", "kids": [{}]}]},
             {"name": "a", "kids": [{"name": "b", "kids": [{"name": "c"}]}]}, {"name": "toolong"}]


def _beside_ref(schema) -> list[str]:
    return [p for p, node, _ in iter_subschemas(schema) if isinstance(node, dict) and "$ref" in node
            and asserting(node, "$ref")]


@pytest.mark.parametrize("schema", [TREE, ROOT_TREE], ids=["defs", "root"])
def test_the_keywords_become_a_definition_of_their_own(schema):
    result = rewrite(schema, ENFORCED_FORMATS)
    assert _beside_ref(schema) and _beside_ref(result.schema) == []
    assert result.rules["ref-siblings-recursive"] >= 1 and result.narrowed == []
    [(name, definition)] = [(n, d) for n, d in result.schema["$defs"].items() if n.startswith("formwork-ref-")]
    assert definition["required"] == ["name"]
    assert definition["properties"]["kids"]["items"] == {"$ref": f"#/$defs/{name}"}  # it refers to itself
    original, rewritten = jsonschema.Draft202012Validator(schema), jsonschema.Draft202012Validator(result.schema)
    for instance in INSTANCES:
        assert rewritten.is_valid(instance) == original.is_valid(instance), instance


def test_other_keywords_beside_the_same_reference_get_another_definition():
    node = {"type": "object", "properties": {
        "a": {"type": "array", "items": {"$ref": "#/$defs/n", "required": ["x"]}},
        "b": {"type": "array", "items": {"$ref": "#/$defs/n", "maxProperties": 1}},
        "x": {"type": "integer"}}}
    schema = {"$defs": {"n": node}, "$ref": "#/$defs/n"}
    result = rewrite(schema, ENFORCED_FORMATS)
    assert _beside_ref(result.schema) == []
    assert len([n for n in result.schema["$defs"] if n.startswith("formwork-ref-")]) == 2
    original, rewritten = jsonschema.Draft202012Validator(schema), jsonschema.Draft202012Validator(result.schema)
    for instance in [{"a": [{"x": 1}]}, {"a": [{}]}, {"b": [{"x": 1}]}, {"b": [{"x": 1, "a": []}]},
                     {"a": [{"x": 1, "b": [{}]}]}, {"a": [{"x": 1, "b": [{"x": 2, "a": []}]}]}]:
        assert rewritten.is_valid(instance) == original.is_valid(instance), instance


def test_a_reference_to_something_else_is_left_alone():
    schema = {"type": "object", "properties": {"k": {"$ref": "other.json#/x", "required": ["a"]}}}
    assert rewrite(schema, ENFORCED_FORMATS).schema == schema


@pytest.mark.parametrize("schema", [TREE, ROOT_TREE], ids=["defs", "root"])
@pytest.mark.parametrize("make", [make_backend, make_llguidance_backend], ids=["xgrammar", "llguidance"])
def test_both_backends_enforce_it_strict(schema, make):
    backend = make()
    compiled = backend.compile(make_constraint(spec=schema, whitespace="spaced"))
    validator = jsonschema.Draft202012Validator(schema)
    for instance in INSTANCES:
        assert accepted_by(backend, compiled, json.dumps(instance)) == validator.is_valid(instance), instance
