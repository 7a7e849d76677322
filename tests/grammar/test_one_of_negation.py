"""A oneOf no proof makes exclusive, written as "this branch and not the others": hand-computed
results, and the same verdict as the original on every instance tried."""
from __future__ import annotations

import jsonschema
import pytest

from grammar.json_schema.rewrite import rewrite
from grammar.xgrammar.schema_gaps import ENFORCED_FORMATS
from grammar.xgrammar.schema_gaps import find_unsupported

CLOSED = {"type": "object", "additionalProperties": False}


def _same_verdicts(original, rewritten, instances):
    for instance in instances:
        assert jsonschema.Draft202012Validator(rewritten).is_valid(instance) == \
            jsonschema.Draft202012Validator(original).is_valid(instance), instance


def test_two_closed_objects_both_valid_for_the_empty_object():
    # {} is valid against both, so against the oneOf never; an instance with x is valid against
    # the first alone: each branch gets "a name the other does not declare is present"
    a = {**CLOSED, "properties": {"x": {"type": "string"}}}
    b = {**CLOSED, "properties": {"y": {"type": "integer"}}}
    result = rewrite({"oneOf": [a, b]}, ENFORCED_FORMATS)
    assert result.schema == {"anyOf": [{**a, "required": ["x"]}, {**b, "required": ["y"]}]}
    assert result.narrowed == []
    _same_verdicts({"oneOf": [a, b]}, result.schema, [{}, {"x": "s"}, {"y": 1}, {"x": "s", "y": 1}, {"x": 1}, 3])


def test_a_shared_name_with_different_schemas_keeps_the_value_apart():
    a = {**CLOSED, "properties": {"v": {"type": "string"}, "a": {"type": "boolean"}}}
    b = {**CLOSED, "properties": {"v": {"type": ["string", "integer"]}}}
    schema = {"oneOf": [a, b]}
    result = rewrite(schema, ENFORCED_FORMATS)
    assert "oneOf" not in result.schema and find_unsupported(result.schema) == []
    _same_verdicts(schema, result.schema, [{}, {"v": "s"}, {"v": 1}, {"a": True}, {"v": "s", "a": False},
                                           {"v": 1, "a": True}, {"v": None}])


def test_branches_told_apart_by_a_nested_tag_that_may_be_absent():
    # {} and {"items": []} are valid against both branches (the tag is optional)
    def branch(system):
        return {"type": "object", "properties": {
            "kind": {"type": "object", "required": ["sys"], "properties": {"sys": {"enum": [system]}}},
            "items": {"type": "array", "items": {"type": "string"}}}}
    schema = {"oneOf": [branch("zypp"), branch("yum")]}
    result = rewrite(schema, ENFORCED_FORMATS)
    assert result.schema == {"anyOf": [{**branch("zypp"), "required": ["kind"]},
                                       {**branch("yum"), "required": ["kind"]}]}
    _same_verdicts(schema, result.schema, [{}, {"items": []}, {"kind": {"sys": "zypp"}}, {"kind": {"sys": "yum"}},
                                           {"kind": {"sys": "apt"}}, {"kind": {}, "items": ["a"]}])


def test_a_branch_inside_the_other_leaves_only_the_difference():
    # every integer is a number: the oneOf is "a number that is not an integer", which no type
    # says, so it is left for the checker
    schema = {"oneOf": [{"type": "number"}, {"type": "integer"}]}
    assert rewrite(schema, ENFORCED_FORMATS).schema == schema
    # a string of at most 3 characters is valid against both: the rest of each
    short = {"oneOf": [{"type": "string", "maxLength": 3}, {"type": "string", "minLength": 2}]}
    result = rewrite(short, ENFORCED_FORMATS)
    assert result.schema == {"anyOf": [{"type": "string", "maxLength": 1}, {"type": "string", "minLength": 4}]}
    _same_verdicts(short, result.schema, ["", "a", "ab", "abc", "abcd", "abcdefg", 1])


def test_a_complement_it_cannot_write_leaves_the_one_of():
    schema = {"oneOf": [{"type": "string", "format": "date"}, {"type": "string", "pattern": "^2"}]}
    assert rewrite(schema, ENFORCED_FORMATS).schema == schema


@pytest.mark.parametrize("branches", [
    # closing the branches is not enough here: {"r": 1, "l": 2} would still be valid against both
    [{"type": "object", "properties": {"r": {"type": "number"}}, "required": ["r"]},
     {"type": "object", "properties": {"r": {"type": "number"}, "l": {"type": "number"}}, "required": ["l"]}],
])
def test_open_objects_are_closed_where_narrowing_is_allowed_and_it_says_so(branches):
    result = rewrite({"oneOf": branches}, ENFORCED_FORMATS)
    assert "anyOf" in result.schema and any(n.startswith("not at /") for n in result.narrowed)
    instances = [{"r": 1}, {"l": 2}, {"r": 1, "l": 2}, {}, {"r": 1, "l": "x"}, {"l": 2, "z": 0}]
    for instance in instances:  # never looser: what the rewrite accepts, the oneOf accepts
        if jsonschema.Draft202012Validator(result.schema).is_valid(instance):
            assert jsonschema.Draft202012Validator({"oneOf": branches}).is_valid(instance)
    negated = rewrite({"not": {"oneOf": branches}}, ENFORCED_FORMATS)
    assert negated.schema["not"] == {"oneOf": branches}  # negated: not narrowed
