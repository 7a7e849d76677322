"""schema_check: named unsupported keywords with their pointers, limits, best-effort listing."""
from __future__ import annotations

import copy

import pytest
from grammar_factories import accepts, make_backend, make_constraint

from grammar.backend import GrammarError
from grammar.compiler import GrammarCompiler
from grammar.config import GrammarConfig
from grammar.json_schema.limits import check_limits
from grammar.xgrammar.schema_gaps import find_unsupported, normalize

TAGS = {"type": "object", "properties": {
    "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}}}


def findings(schema) -> list[str]:
    return [str(f) for f in find_unsupported(schema)]


def test_unsupported_keyword_is_named_with_its_pointer():
    [finding] = find_unsupported(TAGS)
    assert finding.message.startswith('unsupported keyword "uniqueItems" at /properties/tags')
    assert str(finding) == "uniqueItems at /properties/tags"


def test_pointers_escape_slash_and_tilde_and_name_the_root():
    schema = {"not": {}, "properties": {"a/b~c": {"type": "array", "items": {}, "contains": {}}}}
    assert findings(schema) == ["not at / (the root)", "contains at /properties/a~1b~0c"]


@pytest.mark.parametrize("schema, expected", [
    ({"minLength": 2}, ["minLength at / (the root)"]),  # untyped: xgrammar ignores it
    ({"type": "string", "minLength": 2}, []),
    ({"type": "array", "required": ["a"]}, []),  # excluded by the type: a no-op, not a gap
    ({"type": "string", "pattern": "^a+$", "maxLength": 3}, ["maxLength at / (the root)"]),
    ({"type": "string", "format": "date", "minLength": 3}, ["minLength at / (the root)"]),
    ({"type": "string", "format": "topic"}, ["format at / (the root)"]),
    ({"type": "string", "format": "email"}, []),
    ({"type": "number", "multipleOf": 0.5}, ["multipleOf at / (the root)"]),
    ({"type": "integer", "multipleOf": 5}, []),
    ({"type": "string", "enum": ["a", "b"]}, []),
    ({"type": "integer", "enum": [1, "x"]}, ["type at / (the root)"]),
    ({"type": "string", "enum": ["a"], "maxLength": 3}, ["maxLength at / (the root)"]),
    ({"$defs": {"i": {"type": "integer"}}, "$ref": "#/$defs/i", "minimum": 3}, ["minimum at / (the root)"]),
    ({"$defs": {"i": {"type": "integer"}}, "$ref": "#/$defs/i", "type": "integer", "title": "x"}, []),
    ({"$ref": "#foo"}, ["$ref at / (the root)"]),
    ({"type": "integer", "anyOf": [{"type": "integer", "maximum": 1}, {"type": "integer", "minimum": 5}]}, []),
    ({"type": "integer", "minimum": 0, "anyOf": [{"type": "integer"}]}, ["minimum at / (the root)"]),
    ({"allOf": [{"type": "integer"}, {"type": "integer", "minimum": 2}]}, ["allOf at / (the root)"]),
    ({"type": "object", "required": ["a"]}, ["required at / (the root)"]),
    ({"properties": {"a": {}}, "required": ["a"]}, []),  # properties make xgrammar read an object
    ({"type": "object", "x-vendor": 1, "nullable": True, "readonly": True}, []),
    ({"if": {"type": "integer"}, "then": {"minimum": 1}}, ["if at / (the root)", "then at / (the root)",
                                                           "minimum at /then"]),
])
def test_measured_rules(schema, expected):
    assert findings(schema) == expected


def test_a_typical_extraction_schema_has_no_findings():
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "description": "full name"},
        "email": {"type": "string", "format": "email"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "user"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 5},
        "address": {"$ref": "#/$defs/address"}},
        "required": ["name", "age"], "additionalProperties": False,
        "$defs": {"address": {"type": "object", "properties": {"city": {"type": "string"}}}}}
    assert findings(schema) == []


def test_strict_constraint_fails_best_effort_lists_not_enforced():
    backend = make_backend()
    with pytest.raises(GrammarError, match='unsupported keyword "uniqueItems" at /properties/tags'):
        backend.compile(make_constraint(spec=TAGS))
    compiled = backend.compile(make_constraint(spec=TAGS, strict=False))
    assert compiled.not_enforced == ["uniqueItems at /properties/tags"]
    assert accepts(compiled, '{"tags":["a","a"]}')  # exactly the gap that was reported


def test_spec_size_limit_names_the_limit_and_the_numbers():
    constraint = make_constraint("regex", "a" * 2000)
    with pytest.raises(GrammarError, match="2000 bytes, over the max_spec_bytes limit of 1000"):
        check_limits(constraint, max_spec_bytes=1000, max_schema_depth=64)


def test_depth_limit_names_the_limit_and_the_numbers():
    schema: dict = {"type": "string"}
    for _ in range(9):
        schema = {"type": "object", "properties": {"x": schema}}
    with pytest.raises(GrammarError, match="nesting depth is 10, over the max_schema_depth limit of 8"):
        check_limits(make_constraint(spec=schema), max_spec_bytes=1 << 20, max_schema_depth=8)
    check_limits(make_constraint(spec=schema), max_spec_bytes=1 << 20, max_schema_depth=10)


def test_absurd_nesting_is_a_grammar_error_not_a_crash():
    spec = '{"items":' * 100_000 + "{}" + "}" * 100_000
    compiler = GrammarCompiler(make_backend(), GrammarConfig(max_spec_bytes=1 << 21))
    with pytest.raises(GrammarError, match="nested too deeply"):
        compiler.compile_sync(make_constraint(spec=spec))
    compiler.shutdown()


def test_compiler_enforces_the_configured_limits():
    compiler = GrammarCompiler(make_backend(), GrammarConfig(max_spec_bytes=64, max_schema_depth=2))
    with pytest.raises(GrammarError, match="max_spec_bytes limit of 64"):
        compiler.compile_sync(make_constraint(spec={"type": "string", "description": "x" * 100}))
    with pytest.raises(GrammarError, match="max_schema_depth limit of 2"):
        compiler.compile_sync(make_constraint(spec={"properties": {"a": {"items": {}}}}))
    compiler.shutdown()


def test_normalize_only_frees_objects_and_arrays_that_declare_no_members():
    schema = {"type": "object", "maxProperties": 2, "properties": {
        "a": {"type": "array", "minItems": 1}, "b": {"type": "object", "properties": {"c": {}}}}}
    original = copy.deepcopy(schema)
    out = normalize(schema)
    assert "additionalProperties" not in out  # declares properties: strict mode applies
    assert out["properties"]["a"]["items"] is True
    assert "additionalProperties" not in out["properties"]["b"]
    assert schema == original  # the input is not modified


@pytest.mark.parametrize("schema, words", [
    ({"type": "string", "maxLength": -1}, '"maxLength" at / (the root) must be a non-negative integer, got -1'),
    ({"pattern": 5}, '"pattern" at / (the root) must be a string, got 5'),
    ({"properties": {"a": {"minItems": 1.5}}}, '"minItems" at /properties/a must be a non-negative integer'),
    ({"type": [5]}, '"type" at / (the root) must be a type name or a non-empty list of them, got [5]'),
    ({"required": "a"}, '"required" at / (the root) must be a list of strings'),
    ({"properties": []}, '"properties" at / (the root) must be an object of subschemas'),
    ({"properties": {"a": 5}}, "the subschema at /properties/a must be an object or a boolean, got 5"),
    ({"anyOf": []}, '"anyOf" at / (the root) must be a non-empty list'),
    ({"multipleOf": 0}, '"multipleOf" at / (the root) must be a number > 0'),
    ({"items": {"pattern": "a{100001}"}}, '"pattern" at /items has the repetition count 100001'),
    ({"patternProperties": {"x{999999}": {}}}, "the \"patternProperties\" key 'x{999999}' at / (the root) has"),
])
def test_malformed_keyword_values_are_named_with_their_pointer(schema, words):
    from grammar.json_schema.values import check_keyword_values
    with pytest.raises(GrammarError) as info:
        check_keyword_values(schema, max_repeat_count=100_000)
    assert str(info.value).startswith("json_schema does not compile: ") and words in str(info.value)
    for strict in (True, False):  # invalid is invalid, strict or not
        with pytest.raises(GrammarError):
            make_backend().compile(make_constraint(spec=schema, strict=strict))


@pytest.mark.parametrize("schema", [
    {"type": "string", "maxLength": 2.0, "minLength": 0},  # 2.0 is an integer in JSON Schema
    {"type": "number", "exclusiveMinimum": True, "minimum": 0},  # draft 4
    {"type": ["string", "null"], "pattern": "a{3}"},
    {"items": [{"type": "string"}], "additionalItems": False},
    True,
])
def test_well_formed_keyword_values_pass(schema):
    from grammar.json_schema.values import check_keyword_values
    check_keyword_values(schema, max_repeat_count=100_000)
