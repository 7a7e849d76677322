"""patternProperties whose patterns no name matches two of (told apart), and a declared property
a pattern matches: hand-computed proofs, the rewrite's verdicts against jsonschema's, and both
backends enforcing them strict."""
from __future__ import annotations

import json

import jsonschema
import pytest
from grammar_factories import accepted_by, make_backend, make_constraint, make_llguidance_backend

from grammar.json_schema.pattern_names import names_told_apart
from grammar.json_schema.rewrite import rewrite
from grammar.xgrammar.schema_gaps import ENFORCED_FORMATS, find_unsupported


@pytest.mark.parametrize("first, second", [
    ("^x-", "^y-"), ("^[0-9]+$", "^[a-z]+$"), (r"^\d+$", "^[a-z_]+$"), ("^a[0-9]", "^a[a-f]"),
("^[^a-z]", "^[b-d]x"), ("^ab|^ac", "^b"), (r"^\w", "^-"),
])
def test_patterns_told_apart(first, second):
    assert names_told_apart(first, second) and names_told_apart(second, first)


@pytest.mark.parametrize("first, second", [
    ("^x", "^x-"),  # "x-a" matches both
    ("x-", "^y-"),  # unanchored: "y-x-" matches both
    ("^.", "^a"), ("^a?b", "^b"), ("^[^a]", "^[^b]"), (r"^\s", "^ "), ("^(ab|c)", "^a"), ("^a*", "^b"),
    (r"^\D", "^\u0663"),  # an Arabic-Indic digit: \D for ECMA-262, not for Python
    ("^[", "^a"),  # not a pattern
])
def test_patterns_not_told_apart(first, second):
    assert not names_told_apart(first, second)
    assert not names_told_apart(second, first)


def test_the_names_really_are_apart():
    # what the proof says, checked on names: none matches two told-apart patterns
    import re
    names = ["x-a", "y-b", "12", "ab", "a1", "af", "-", "_x", "b", "bx", "ca", "x", ""]
    for first, second in [("^x-", "^y-"), ("^[0-9]+$", "^[a-z]+$"), ("^a[0-9]", "^a[a-f]"), ("^[^a-z]", "^[b-d]x")]:
        assert not [n for n in names if re.search(first, n) and re.search(second, n)]


# closed, with patterns that match whole names: xgrammar generates no other names, and reads every
# pattern as a whole match (docs/constraints.md)
SCHEMAS = {
    "disjoint": {"type": "object", "patternProperties": {"^x-[a-z]*$": {"type": "string"},
                                                          "^y-[a-z]*$": {"type": "integer"}},
                 "additionalProperties": False},
    "classes": {"type": "object", "additionalProperties": False,
                "patternProperties": {"^[0-9]+$": {"type": "string"}, "^[a-z]+$": {"type": "integer"}}},
    "declared": {"type": "object", "properties": {"x-a": {}, "name": {"type": "string"}},
                 "patternProperties": {"^x-[a-z]*$": {"type": "string", "maxLength": 2}},
                 "additionalProperties": False},
}
INSTANCES = [{}, {"x-a": "s"}, {"x-a": 1}, {"y-b": 1}, {"y-b": "s"}, {"x-a": "s", "y-b": 2}, {"12": "s"},
             {"12": 1}, {"ab": 1}, {"ab": "s"}, {"x-a": "long"}, {"x-a": "ok", "name": "n"}]


@pytest.mark.parametrize("name", SCHEMAS)
def test_the_rewrite_keeps_the_verdicts_and_passes_the_check(name):
    schema = SCHEMAS[name]
    result = rewrite(schema, ENFORCED_FORMATS)
    assert find_unsupported(result.schema) == [] and result.narrowed == []
    original, rewritten = jsonschema.Draft202012Validator(schema), jsonschema.Draft202012Validator(result.schema)
    for instance in INSTANCES:
        assert rewritten.is_valid(instance) == original.is_valid(instance), instance


def test_a_declared_name_gets_the_schema_of_the_pattern_it_matches():
    result = rewrite(SCHEMAS["declared"], ENFORCED_FORMATS)
    assert result.schema["properties"] == {"x-a": {"type": "string", "maxLength": 2}, "name": {"type": "string"}}
    assert result.rules["patternProperties-declared"] == 1


def test_overlapping_patterns_and_a_narrower_declared_name_stay_refused():
    overlapping = {"type": "object", "patternProperties": {"^x": {"type": "string"}, "^x-": {"type": "integer"}}}
    narrower = {"type": "object", "properties": {"x-a": {"type": "string", "maxLength": 3}},
                "patternProperties": {"^x-": {"type": "string"}}}
    for schema in (overlapping, narrower):
        assert [f.keyword for f in find_unsupported(rewrite(schema, ENFORCED_FORMATS).schema)] == ["patternProperties"]


@pytest.mark.parametrize("name", SCHEMAS)
@pytest.mark.parametrize("make", [make_backend, make_llguidance_backend], ids=["xgrammar", "llguidance"])
def test_both_backends_enforce_them_strict(name, make):
    schema, backend = SCHEMAS[name], make()
    compiled = backend.compile(make_constraint(spec=schema, whitespace="spaced"))
    validator = jsonschema.Draft202012Validator(schema)
    for instance in INSTANCES:
        assert accepted_by(backend, compiled, json.dumps(instance)) == validator.is_valid(instance), instance
