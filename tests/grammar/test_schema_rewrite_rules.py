"""The rewrite's `not` complements and `uniqueItems` rules, with hand-computed expectations."""
from __future__ import annotations

import json

import pytest
from grammar_factories import accepts, make_backend, make_constraint

from grammar.json_schema.merge import merge
from grammar.json_schema.patterns import optional_groups
from grammar.json_schema.rewrite import rewrite
from grammar.xgrammar.schema_gaps import ENFORCED_FORMATS
from grammar.xgrammar.schema_gaps import find_unsupported


def rewritten(schema):
    return rewrite(schema, ENFORCED_FORMATS).schema


CLOSED = {"type": "object", "additionalProperties": False}


# -- not ---------------------------------------------------------------------------------------

def test_two_nots_merge_into_not_of_any_of():
    assert merge({"not": {"required": ["a"]}}, {"not": {"required": ["b"]}}) == {
        "not": {"anyOf": [{"required": ["a"]}, {"required": ["b"]}]}}


def test_not_required_in_a_closed_object_removes_the_name_exactly():
    schema = {**CLOSED, "properties": {"a": {}, "b": {}}, "not": {"required": ["a"]}}
    result = rewrite(schema, ENFORCED_FORMATS)
    assert result.schema == {**CLOSED, "properties": {"b": {}}}
    assert result.narrowed == []


def test_not_required_of_an_open_object_closes_it_narrowing():
    schema = {"type": "object", "properties": {"x": {"type": "string"}},
              "allOf": [{"not": {"required": ["hosts"]}}, {"not": {"required": ["tasks"]}}]}
    result = rewrite(schema, ENFORCED_FORMATS)
    assert result.schema == {**CLOSED, "properties": {"x": {"type": "string"}}}
    assert "not at /" in result.narrowed


def test_not_required_of_a_required_name_allows_nothing():
    assert rewritten({**CLOSED, "properties": {"a": {}}, "required": ["a"], "not": {"required": ["a"]}}) is False


def test_not_of_any_of_required_pairs_keeps_the_smallest_absent_sets():
    # not (d and x) and not (d and y): d absent, or both x and y absent
    schema = {**CLOSED, "properties": {"d": {}, "x": {}, "y": {}},
              "not": {"anyOf": [{"required": ["d", "x"]}, {"required": ["d", "y"]}]}}
    assert rewritten(schema) == {"anyOf": [{**CLOSED, "properties": {"x": {}, "y": {}}},
                                           {**CLOSED, "properties": {"d": {}}}]}


def test_not_of_properties_requires_the_name_with_the_complement():
    schema = {"type": "object", "properties": {"features": {"type": "array"}}, "required": ["id"],
              "not": {"properties": {"features": {"maxItems": 0}}}}
    # (id, required but undeclared, is declared with the schema that applies to it: true)
    assert rewritten(schema) == {"type": "object", "required": ["id", "features"],
                                 "properties": {"features": {"type": "array", "minItems": 1}, "id": True}}


@pytest.mark.parametrize("schema, expected", [
    ({"type": "string", "maxLength": 100, "not": {"pattern": "[^a-z ]"}}, {"type": "string", "pattern": "^[a-z ]{0,100}$"}),
    ({"type": "string", "not": {"pattern": "[0-9]"}}, {"type": "string", "pattern": "^[^0-9]*$"}),
    ({"enum": ["a", "b", "c"], "not": {"enum": ["b"]}}, {"enum": ["a", "c"]}),
    ({"type": "string", "enum": ["x", "y"], "not": {"const": "x"}}, {"enum": ["y"]}),
    ({"type": "integer", "not": {"maximum": 5}}, {"type": "integer", "minimum": 6}),
    ({"type": "integer", "not": {"exclusiveMinimum": 2.5}}, {"type": "integer", "maximum": 2}),
    ({"type": "array", "not": {"minItems": 2}}, {"type": "array", "maxItems": 1}),
    ({"type": ["string", "null"], "not": {"type": "string", "minLength": 1}},
     {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 0}]}),
    ({"type": "string", "not": {"not": {"minLength": 3}}}, {"type": "string", "minLength": 3}),
])
def test_not_is_its_complement_within_the_node(schema, expected):
    assert rewritten(schema) == expected


def test_not_of_anything_is_false_and_not_of_nothing_is_dropped():
    assert rewritten({"type": "string", "not": {}}) is False
    assert rewritten({"type": "string", "not": False}) == {"type": "string"}


@pytest.mark.parametrize("schema", [
    {"type": "string", "not": {"pattern": "^a"}},  # no complement written for general patterns
    {"type": "number", "not": {"maximum": 5}},  # would need an exclusive bound (draft 4 spells it otherwise)
    {"type": "object", "properties": {"a": {"type": "string"}}, "not": {"required": ["a"]},
     "patternProperties": {"^a": {"type": "string"}}},  # a pattern may still admit the name
    {"type": "string", "not": {"enum": ["a"]}},  # infinitely many other strings
])
def test_not_without_a_written_complement_is_left_for_the_checker(schema):
    assert rewritten(schema) == schema
    assert any(f.keyword == "not" for f in find_unsupported(rewritten(schema)))


def test_not_under_one_of_does_not_close_an_open_object():
    # narrowing a oneOf branch could make an instance match one branch instead of two (four
    # branches: more than the oneOf rule writes out as "this branch and not the others")
    branches = [{"type": "object", "properties": {"a": {}}, "not": {"required": ["b"]}},
                {"type": "object", "properties": {"a": {"type": "string"}}}]
    schema = {"oneOf": [*branches, {"type": "string"}, {"type": "integer"}]}
    assert rewritten(schema) == schema
    # two branches: written as an anyOf of each branch without the other, whose branches may narrow
    result = rewrite({"oneOf": branches}, ENFORCED_FORMATS)
    assert result.schema == {"anyOf": [
        {"type": "object", "properties": {"a": {"type": ["null", "boolean", "object", "array", "number"]}},
         "required": ["a"], "additionalProperties": False},  # no b, and an a that is not a string
        {"type": "object", "properties": {"a": {"type": "string"}, "b": True}, "required": ["b"]}]}
    assert result.narrowed == ["not at /"]  # the first closed to keep b out


# -- uniqueItems -------------------------------------------------------------------------------

@pytest.mark.parametrize("schema, expected", [
    ({"type": "array", "items": {"type": "string"}, "maxItems": 1, "uniqueItems": True},
     {"type": "array", "items": {"type": "string"}, "maxItems": 1}),
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": False}, {"type": "array", "items": {"type": "string"}}),
    ({"description": "d", "type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True},
     {"description": "d", "enum": [[], ["a"], ["b"], ["a", "b"], ["b", "a"]]}),
    ({"type": "array", "items": {"type": "string", "enum": ["a", "b", 1]}, "minItems": 2, "uniqueItems": True},
     {"enum": [["a", "b"], ["b", "a"]]}),
    ({"type": "array", "items": {"const": 1}, "minItems": 2, "uniqueItems": True}, False),
])
def test_unique_items_where_it_can_be_written(schema, expected):
    assert rewritten(schema) == expected


@pytest.mark.parametrize("schema", [
    {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
    {"type": "array", "items": {"enum": list(range(6))}, "uniqueItems": True},  # 1,957 arrays: too many
    {"type": "array", "items": {"enum": ["a"]}, "contains": {"const": "a"}, "uniqueItems": True},
])
def test_unique_items_otherwise_stays_refused(schema):
    assert rewritten(schema) == schema
    assert any(f.keyword == "uniqueItems" for f in find_unsupported(schema))


# -- optional groups in patterns ----------------------------------------------------------------

@pytest.mark.parametrize("pattern, expected", [
    ("^\\d+(x[a-z_-]+)?$", "^\\d+(x[a-z_-]+){0,1}$"),
    ("^a(b(c)?)??$", "^a(b(c){0,1}){0,1}?$"),  # nested, and lazy
    ("^[()?]\\)?(?:x)?$", "^[()?]\\)?(?:x){0,1}$"),  # a class and an escaped ")" are not groups
    ("^a[]b)?$", "^a[]b)?$"),  # "[]": ECMA-262 and Python disagree; left alone
])
def test_optional_groups_are_spelled_zero_or_one(pattern, expected):
    assert optional_groups(pattern) == expected


def test_optional_group_ending_in_a_repeat_is_enforced():
    # measured: xgrammar's regex engine (JSON-schema path) accepted "5_" for this pattern as written
    schema = {"type": "string", "pattern": "^\\d+(x[a-z_-]+)?$"}
    compiled = make_backend().compile(make_constraint(spec=json.dumps(schema)))
    assert accepts(compiled, '"5"') and accepts(compiled, '"5xa_-"')
    assert not accepts(compiled, '"5_"') and not accepts(compiled, '"5x"')
    semver = {"type": "string", "pattern": "^\\d+(\\.\\d+(\\.\\d+([.-][a-zA-Z0-9_-]+)?)?)?$"}
    compiled = make_backend().compile(make_constraint(spec=json.dumps(semver)))
    assert accepts(compiled, '"1.2.3-beta"') and accepts(compiled, '"1"')
    assert not accepts(compiled, '"1.2_"') and not accepts(compiled, '"1.2.3-"')


# -- through the backend -----------------------------------------------------------------------

def test_negations_and_unique_items_compile_strict_and_are_enforced():
    schema = {**CLOSED, "required": ["name", "tags"],
              "properties": {"name": {"type": "string", "maxLength": 5, "not": {"pattern": "[^a-z]"}},
                             "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "uniqueItems": True},
                             "debug": {"type": "boolean"}},
              "not": {"required": ["debug"]}}
    assert find_unsupported(schema)
    compiled = make_backend().compile(make_constraint(spec=json.dumps(schema)))
    assert accepts(compiled, '{"name":"abc","tags":["y","x"]}')
    assert not accepts(compiled, '{"name":"aBc","tags":["x"]}')
    assert not accepts(compiled, '{"name":"abcdef","tags":[]}')
    assert not accepts(compiled, '{"name":"abc","tags":["x","x"]}')
    assert not accepts(compiled, '{"name":"abc","tags":[],"debug":true}')


# -- oneOf exclusivity -------------------------------------------------------------------------

@pytest.mark.parametrize("one_of", [
    # the tag is required in one branch only: present, it has the other branch's value too
    [{"type": "object", "properties": {"kind": {"const": "a"}}, "required": ["kind"]},
     {"type": "object", "properties": {"kind": {"const": "b"}, "x": {}}}],
    # the tag's values through references
    [{"type": "object", "properties": {"k": {"$ref": "#/$defs/A"}}, "required": ["k"]},
     {"type": "object", "properties": {"k": {"$ref": "#/$defs/B"}}, "required": ["k"]}],
    # a branch's types are its anyOf's
    [{"anyOf": [{"type": "string"}, {"type": "null"}]}, {"type": "object"}],
])
def test_one_of_proven_exclusive_in_more_shapes(one_of):
    schema = {"$defs": {"A": {"enum": ["a"]}, "B": {"enum": ["b"]}}, "oneOf": one_of}
    assert rewritten(schema) == {"$defs": schema["$defs"], "anyOf": one_of}


def test_one_of_of_open_objects_closed_when_that_makes_them_exclusive_narrowing():
    # {"id": "x", "win": {}, "lose": {}} is valid against both branches as written; closed, each
    # branch lacks the name the other requires
    one_of = [{"type": "object", "required": ["id", "win"], "properties": {"id": {}, "win": {}}},
              {"type": "object", "required": ["id", "lose"], "properties": {"id": {}, "lose": {}}}]
    result = rewrite({"oneOf": one_of}, ENFORCED_FORMATS)
    assert result.schema == {"anyOf": [{**b, "additionalProperties": False} for b in one_of]}
    assert result.narrowed == ["oneOf-closed at /"]
    both_optional = [{"type": "object", "properties": {"a": {}}}, {"type": "object", "properties": {"b": {}}}]
    # every object is valid against both (neither asserts anything about a or b): nothing is valid
    assert rewritten({"oneOf": both_optional}) is False


def test_a_false_property_is_removed_and_a_required_one_allows_nothing():
    schema = {"$defs": {"never": {"not": {}}}, **CLOSED,
              "properties": {"a": False, "b": {"$ref": "#/$defs/never"}, "c": {}}}
    assert rewritten(schema) == {"$defs": {"never": False}, **CLOSED, "properties": {"c": {}}}
    assert rewritten({**schema, "required": ["a"]}) is False


def test_one_of_of_untyped_tags_still_overlaps():
    # "x" (not an object) is valid against both
    schema = {"oneOf": [{"properties": {"k": {"const": "a"}}, "required": ["k"]}, {"properties": {"k": {"const": "b"}}}]}
    assert rewritten(schema) == schema


def test_a_false_pattern_property_keeps_its_names_out():
    pattern = {"^\\d+$": {"type": "object", "properties": {"x": {}}, "additionalProperties": False, "required": ["y"]}}
    closed = {"type": "object", "patternProperties": pattern, "additionalProperties": False, "properties": {"7": {}}}
    result = rewrite(closed, ENFORCED_FORMATS)  # no numeric name can be valid ("y" cannot be there): "7" neither
    assert result.schema == {"type": "object", "additionalProperties": False, "properties": {}}
    assert result.narrowed == []
    open_object = {"type": "object", "patternProperties": pattern}
    result = rewrite(open_object, ENFORCED_FORMATS)
    assert result.schema == {"type": "object", "additionalProperties": False}
    assert "false-pattern at /" in result.narrowed  # other names were allowed
    both = {"type": "object", "patternProperties": {"f.*": True, "b.*": False}}
    assert rewritten(both) == both  # "foobar" matches both: invalid, and it would pass "f.*" alone
    negated = rewritten({"not": open_object})["not"]  # negated: not closed (the pattern's schema is false)
    assert negated == {"type": "object", "patternProperties": {"^\\d+$": False}}


def test_siblings_that_assert_nothing_are_dropped_where_the_others_cannot_be_merged():
    # a recursive branch cannot be merged with the siblings; additionalProperties {} says nothing
    schema = {"type": "object", "properties": {"a": {"type": "string"}},
              "$defs": {"node": {"type": "object", "additionalProperties": {},
                                 "anyOf": [{"$ref": "#"}, {"$ref": "#/$defs/leaf"}]},
                        "leaf": {"type": "object", "properties": {"b": {"$ref": "#/$defs/node"}}}}}
    node = rewritten(schema)["$defs"]["node"]
    assert "additionalProperties" not in node and node["type"] == "object" and "anyOf" in node


def test_a_class_holding_a_quote_beside_other_characters_loses_it_flagged_narrowing():
    printable = r'^[ !"#$%&\'()*+,\-./0-9:;<=>?@A-Z\[\\\]\^_`a-z{\|}]+$'
    schema = {"type": "object", "properties": {"id": {"type": "string", "pattern": printable,
                                                      "minLength": 30, "maxLength": 30}}}
    assert sorted(f.keyword for f in find_unsupported(schema)) == ["maxLength", "minLength", "pattern"]
    result = rewrite(schema, ENFORCED_FORMATS)
    # the quote and the backslash leave the class, then the lengths fold into the pattern
    assert result.schema["properties"]["id"] == {
        "type": "string", "pattern": r"^[ !#$%&\'()*+,\-./0-9:;<=>?@A-Z\[\]\^_`a-z{\|}]{30}$"}
    assert result.narrowed == ["class-without-quotes at /properties/id"]
    assert find_unsupported(result.schema) == []
    # under not, narrowing the pattern would widen the schema: left for the checker
    negated = {"type": "string", "not": {"type": "string", "pattern": r'^[a"]$'}}
    assert rewritten(negated)["not"]["pattern"] == r'^[a"]$'
