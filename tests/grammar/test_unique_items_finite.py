"""uniqueItems over items drawn from a small finite set (booleans, null, an enum or const, an
anyOf of those): every duplicate-free array listed, the same verdicts as the original (jsonschema
the reference), enforced strict by both backends."""
from __future__ import annotations

import itertools
import json

import jsonschema
import pytest
from grammar_factories import accepted_by, make_backend, make_constraint, make_llguidance_backend

from grammar.json_schema.rewrite import rewrite
from grammar.xgrammar.schema_gaps import ENFORCED_FORMATS, find_unsupported

SCHEMAS = {
    "booleans": {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True},
    "boolean or null": {"type": "array", "items": {"type": ["boolean", "null"]}, "uniqueItems": True, "minItems": 1},
    "anyOf of consts": {"type": "array", "items": {"anyOf": [{"const": "a"}, {"const": "b"}, {"type": "null"}]},
                        "uniqueItems": True},
    "oneOf of enums": {"type": "array", "items": {"oneOf": [{"enum": ["a", "b"]}, {"enum": [1]}]}, "uniqueItems": True},
    "five values": {"type": "array", "items": {"enum": ["a", "b", "c", "d", "e"]}, "uniqueItems": True},
    "referenced enum": {"$defs": {"e": {"enum": [1, 2, 3]}}, "type": "array", "items": {"$ref": "#/$defs/e"},
                        "uniqueItems": True, "maxItems": 2},
}
VALUES = [True, False, None, "a", "b", "e", 1, 2, 3]


def _instances() -> list:
    """Arrays of up to 3 of VALUES, duplicates included."""
    return [list(a) for n in range(4) for a in itertools.product(VALUES, repeat=n)]


@pytest.mark.parametrize("name", SCHEMAS)
def test_written_out_with_the_same_verdicts(name):
    schema = SCHEMAS[name]
    result = rewrite(schema, ENFORCED_FORMATS)
    assert result.rules["uniqueItems"] == 1 and result.narrowed == []
    assert find_unsupported(result.schema) == []
    original, rewritten = jsonschema.Draft202012Validator(schema), jsonschema.Draft202012Validator(result.schema)
    for instance in _instances():
        assert rewritten.is_valid(instance) == original.is_valid(instance), instance


def test_the_booleans_hand_computed():
    assert rewrite(SCHEMAS["booleans"], ENFORCED_FORMATS).schema == {
        "enum": [[], [False], [True], [False, True], [True, False]]}


@pytest.mark.parametrize("schema", [
    {"type": "array", "items": {"enum": list("abcdef")}, "uniqueItems": True},  # 1,957 arrays: past the bound
    {"type": "array", "items": {"type": ["boolean", "string"]}, "uniqueItems": True},
    {"type": "array", "items": {"anyOf": [{"const": "a"}, {"type": "integer"}]}, "uniqueItems": True},
])
def test_otherwise_stays_refused(schema):
    assert any(f.keyword == "uniqueItems" for f in find_unsupported(rewrite(schema, ENFORCED_FORMATS).schema))


@pytest.mark.parametrize("name", ["booleans", "anyOf of consts", "referenced enum"])
@pytest.mark.parametrize("make", [make_backend, make_llguidance_backend], ids=["xgrammar", "llguidance"])
def test_both_backends_enforce_it_strict(name, make):
    schema, backend = SCHEMAS[name], make()
    # compact: xgrammar writes an enum's values without whitespace, whatever the mode
    compiled = backend.compile(make_constraint(spec=schema, whitespace="compact"))
    validator = jsonschema.Draft202012Validator(schema)
    for instance in [a for a in _instances() if len(a) <= 2]:
        text = json.dumps(instance, separators=(",", ":"))
        assert accepted_by(backend, compiled, text) == validator.is_valid(instance), instance


def test_a_value_two_one_of_branches_share_is_no_finite_set():
    from grammar.json_schema.arrays import _fixed_values
    # valid against neither branch: the union would admit it
    assert _fixed_values({"oneOf": [{"enum": ["a", "b"]}, {"enum": ["b"]}]}) is None
    assert _fixed_values({"anyOf": [{"enum": ["a", "b"]}, {"enum": ["b"]}]}) == ["a", "b"]
