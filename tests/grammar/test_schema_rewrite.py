"""grammar.json_schema.rewrite and its helpers, rule by rule, with hand-computed expectations."""
from __future__ import annotations

import json

import pytest
from grammar_factories import accepts, make_backend, make_constraint

from grammar.backend import GrammarError
from grammar.json_schema.merge import CannotMerge, EmptyIntersection, merge
from grammar.json_schema.merge import accepts as accepts_value  # grammar_factories has its own accepts
from grammar.json_schema.rewrite import rewrite
from grammar.xgrammar.schema_gaps import ENFORCED_FORMATS
from grammar.regex.length_pattern import fold_lengths
from grammar.xgrammar.schema_gaps import find_unsupported


def rewritten(schema):
    return rewrite(schema, ENFORCED_FORMATS).schema


# -- merge -------------------------------------------------------------------------------------

def test_merge_intersects_types_bounds_and_unites_required():
    a = {"type": ["integer", "string"], "minimum": 1, "maximum": 10, "required": ["a"]}
    b = {"type": "number", "minimum": 3, "maximum": 20, "required": ["b", "a"]}
    assert merge(a, b) == {"type": "integer", "minimum": 3, "maximum": 10, "required": ["a", "b"]}


def test_merge_properties_sees_each_sides_additional_properties():
    closed = {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False}
    other = {"properties": {"a": {"maxLength": 3}, "b": {"type": "integer"}}}
    # b is forbidden by the closed side; a gets both sides' rules
    assert merge(closed, other) == {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}},
                                    "additionalProperties": False}


def test_merge_required_property_that_cannot_exist_is_empty():
    closed = {"type": "object", "properties": {}, "additionalProperties": False}
    with pytest.raises(EmptyIntersection):
        merge(closed, {"required": ["a"], "properties": {"a": {}}})


def test_merge_enum_keeps_the_values_the_other_side_accepts():
    # enum, never const: the schema may be draft 4, which has no const
    assert merge({"enum": ["a", "bb", 3]}, {"type": "string", "maxLength": 1}) == {"enum": ["a"]}
    assert merge({"enum": [1, True]}, {"type": "integer"}) == {"enum": [1]}  # true is not an integer
    with pytest.raises(EmptyIntersection):
        merge({"const": "x"}, {"type": "integer"})


def test_merge_refuses_what_it_cannot_write_exactly():
    with pytest.raises(CannotMerge):
        merge({"pattern": "^a"}, {"pattern": "b$"})
    with pytest.raises(CannotMerge):  # 20 pairs of branches: over MAX_PRODUCT_BRANCHES
        merge({"anyOf": [{"minimum": i} for i in range(4)]}, {"anyOf": [{"maximum": i} for i in range(5)]})
    with pytest.raises(EmptyIntersection):
        merge({"type": "string"}, {"type": "null"})


def test_merge_of_two_any_ofs_or_two_one_ofs_is_the_product_of_their_branches():
    x = [{"type": "string"}, {"type": "integer", "minimum": 0}]
    y = [{"type": "integer", "maximum": 9}, {"type": "null"}]
    assert merge({"anyOf": [{}]}, {"anyOf": [{"type": "null"}]}) == {"anyOf": [{"type": "null"}]}
    assert merge({"anyOf": x}, {"anyOf": y}) == {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}]}
    assert merge({"oneOf": x}, {"oneOf": y}) == {"oneOf": [{"type": "integer", "minimum": 0, "maximum": 9}]}
    with pytest.raises(EmptyIntersection):
        merge({"anyOf": [{"type": "string"}]}, {"anyOf": [{"type": "null"}]})


# -- length_pattern ----------------------------------------------------------------------------

@pytest.mark.parametrize("pattern, low, high, expected", [
    ("^[a-z]+$", 3, 8, ("^[a-z]{3,8}$", False)),  # one variable atom: exact
    ("^[A-Z][a-z]*$", 2, 5, ("^[A-Z][a-z]{1,4}$", False)),
    ("^\\d{4}$", 4, 4, ("^\\d{4}$", False)),  # already implied
    ("[0-9]+", 1, 3, ("^[0-9]{1,3}$", True)),  # unanchored: anchoring narrows
    ("^a", 0, 3, ("^a.{0,2}$", True)),  # an open end is ".*"
    ("^[a-z]*[0-9]*$", 0, 4, ("^[a-z]{0,4}$", True)),  # the other atom capped at its minimum
    ("^(a|b)+$", 1, 3, ("^(a|b){1,3}$", False)),  # a group's repeat capped (grammar/regex/length_caps.py)
    ("^(a|bc)+$", 1, None, ("^(a|bc)+$", False)),  # ... but here they are implied: dropped
    ("^[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$|^[0-9a-f]{16}$", 0, 36,
     ("^[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$|^[0-9a-f]{16}$", False)),  # 36 or 16 characters
    ("^[a-z]{5}$", 1, 3, None),  # fixed length outside the bounds
])
def test_fold_lengths(pattern, low, high, expected):
    assert fold_lengths(pattern, low, high) == expected


# -- the rules ---------------------------------------------------------------------------------

def test_infer_type_from_keywords_of_one_type_narrowing():
    result = rewrite({"properties": {"p": {"minLength": 2}, "q": {"required": ["x"], "properties": {"x": {}}}}},
                     ENFORCED_FORMATS)
    assert result.schema["properties"]["p"] == {"minLength": 2, "type": "string"}
    assert result.schema["properties"]["q"]["type"] == "object"
    assert "infer-type at /properties/p" in result.narrowed
    assert rewritten({"minLength": 1, "minimum": 0}) == {"minLength": 1, "minimum": 0}  # two types: unchanged


def test_required_names_get_the_schema_that_applies_to_them():
    schema = {"type": "object", "required": ["a", "n1"], "patternProperties": {"^n\\d$": {"type": "integer"}},
              "additionalProperties": {"type": "string"}}
    assert rewritten(schema)["properties"] == {"a": {"type": "string"}, "n1": {"type": "integer"}}
    closed = {"type": "object", "required": ["a"], "additionalProperties": False}
    with pytest.raises(GrammarError, match=r"allows no value: it requires \['a'\]"):
        rewrite(closed, ENFORCED_FORMATS)  # nothing valid
    assert rewritten({"anyOf": [closed, {"type": "string"}]}) == {"type": "string"}  # the branch allows nothing
    assert rewritten({"type": ["object", "null"], "required": ["a"]})["properties"] == {"a": True}
    assert rewritten({**closed, "type": ["object", "null"]})["type"] == "null"  # no object is valid


def test_all_of_is_merged_and_an_empty_one_is_an_error():
    schema = {"title": "t", "allOf": [{"type": "integer", "minimum": 0}, {"maximum": 9}]}
    assert rewritten(schema) == {"title": "t", "type": "integer", "minimum": 0, "maximum": 9}
    with pytest.raises(GrammarError, match="allOf at / \\(the root\\) allows no value"):
        rewrite({"allOf": [{"type": "string"}, {"type": "integer"}]}, ENFORCED_FORMATS)


def test_all_of_with_references_inlines_them():
    schema = {"$defs": {"named": {"type": "object", "properties": {"name": {"type": "string"}}}},
              "allOf": [{"$ref": "#/$defs/named"}, {"required": ["name"]}]}
    out = rewritten(schema)
    assert out["type"] == "object" and out["required"] == ["name"] and out["properties"] == {"name": {"type": "string"}}


def test_keywords_beside_any_of_go_into_every_branch_and_empty_branches_drop():
    schema = {"type": "string", "maxLength": 3, "anyOf": [{"pattern": "^a"}, {"type": "null"}, {"enum": ["ab", "abcd"]}]}
    assert rewritten(schema) == {"anyOf": [{"type": "string", "pattern": "^a.{0,2}$"}, {"enum": ["ab"]}]}


def test_one_branch_one_of_is_inlined():
    assert rewritten({"description": "d", "oneOf": [{"type": "string"}]}) == {"description": "d", "type": "string"}


def test_keywords_beside_ref_are_merged_with_the_target_and_recursion_gets_a_definition():
    schema = {"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s", "maxLength": 4}
    assert rewritten(schema) == {"$defs": {"s": {"type": "string"}}, "type": "string", "maxLength": 4}
    recursive = {"$defs": {"t": {"type": "object", "properties": {"c": {"$ref": "#/$defs/t", "maxProperties": 1}}}},
                 "$ref": "#/$defs/t"}
    out = rewritten(recursive)
    [name] = [n for n in out["$defs"] if n != "t"]
    own = {"$ref": f"#/$defs/{name}"}
    assert out["$defs"] == {"t": {"type": "object", "properties": {"c": own}},
                            name: {"maxProperties": 1, "type": "object", "properties": {"c": own}}}


def test_enum_beside_type_keeps_only_the_typed_values():
    assert rewritten({"type": "integer", "enum": [1, "x", 2]}) == {"enum": [1, 2]}


def test_enum_beside_a_type_none_of_its_values_has_allows_nothing():
    # string values beside "type": "object": no instance is valid, so an optional property
    # with it may not appear (false, then removed, the open object closed) ...
    schema = {"type": "object", "properties": {"mode": {"enum": ["all", "ssl"], "type": "object"}, "n": {}}}
    assert rewritten(schema) == {"type": "object", "properties": {"n": {}}, "additionalProperties": False}
    # ... a required one makes the object allow nothing, and so does the node alone
    assert rewritten({**schema, "required": ["mode"]}) is False
    assert rewritten({"const": 3, "type": "string"}) is False


def test_merge_enum_reads_the_branches_of_the_other_side():
    either = {"anyOf": [{"type": "string"}, {"type": "object", "properties": {"key": {"type": "string"}}}]}
    assert merge({"enum": ["key", 3, None]}, either) == {"enum": ["key"]}
    one = {"oneOf": [{"type": "string"}, {"maxLength": 2}]}  # "ab" is valid for both: not exactly one
    assert merge({"enum": ["abc", "ab", 7]}, one) == {"enum": ["abc", 7]}
    assert [accepts_value({"allOf": [{"minimum": 2}, {"maximum": 8}]}, v) for v in (1, 5, 9)] == [False, True, False]
    with pytest.raises(CannotMerge):  # a branch it cannot read
        merge({"enum": ["a"]}, {"anyOf": [{"type": "string", "format": "email"}]})
    # keywords beside a $ref to an anyOf: merged with its target
    schema = {"definitions": {"p": either}, "type": "object",
              "properties": {"t": {"$ref": "#/definitions/p", "enum": ["key", "sas"]}}}
    assert rewritten(schema)["properties"]["t"] == {"enum": ["key", "sas"]}


def test_not_of_a_type_is_its_complement():
    assert rewritten({"type": ["string", "null"], "not": {"type": "null"}}) == {"type": "string"}
    assert rewritten({"type": "boolean", "not": {"const": False}}) == {"enum": [True]}
    assert rewritten({"not": {"type": "string", "minLength": 1}}) == {"not": {"type": "string", "minLength": 1}}


def test_dependent_required_becomes_alternatives():
    schema = {"type": "object", "properties": {"a": {}, "b": {}}, "additionalProperties": False,
              "dependentRequired": {"a": ["b"]}}
    assert rewritten(schema) == {"anyOf": [
        {"type": "object", "properties": {"b": {}}, "additionalProperties": False},
        {"type": "object", "properties": {"a": {}, "b": {}}, "additionalProperties": False, "required": ["a", "b"]}]}


def test_too_many_dependencies_are_left_alone():
    names = [f"p{i}" for i in range(6)]  # 2**6 alternatives > MAX_BRANCHES
    schema = {"type": "object", "properties": {n: {} for n in names}, "additionalProperties": False,
              "dependentRequired": {n: ["p0"] for n in names[1:]} | {"p0": ["p1"]}}
    assert rewritten(schema) == schema


def test_unknown_format_is_dropped_with_a_note_known_one_kept():
    result = rewrite({"type": "string", "format": "color"}, ENFORCED_FORMATS)
    assert result.schema == {"type": "string"}
    assert result.notes == ["format 'color' at / (the root) is an annotation, not checked"]
    assert rewritten({"type": "string", "format": "email"}) == {"type": "string", "format": "email"}


def test_the_formats_kept_are_the_backend_s():
    result = rewrite({"type": "string", "format": "email"}, frozenset({"date"}))
    assert result.schema == {"type": "string"}
    assert result.notes == ["format 'email' at / (the root) is an annotation, not checked"]


def test_integer_bounds_are_clamped_to_int64():
    out = rewritten({"type": "integer", "minimum": -(10 ** 30), "maximum": 10 ** 20})
    assert out == {"type": "integer", "minimum": -(1 << 63), "maximum": (1 << 63) - 1}


def test_one_of_with_disjoint_branches_becomes_any_of():
    by_type = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
    assert rewritten(by_type) == {"anyOf": by_type["oneOf"]}
    tagged = {"oneOf": [
        {"type": "object", "properties": {"k": {"const": "a"}}, "required": ["k"]},
        {"type": "object", "properties": {"k": {"const": "b"}, "x": {}}, "required": ["k", "x"]}]}
    assert "anyOf" in rewritten(tagged)
    overlapping = {"oneOf": [{"type": "integer"}, {"type": "number"}]}
    assert rewritten(overlapping) == overlapping


def test_the_input_is_not_modified_and_a_plain_schema_is_unchanged():
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}, "required": ["a"]}
    before = json.dumps(schema)
    assert rewritten(schema) == schema
    assert json.dumps(schema) == before


def test_a_blow_up_is_refused_with_the_reason():
    # each level doubles: a oneOf of two references to the level below, with a sibling keyword
    defs = {"l0": {"type": "string"}}
    for i in range(1, 30):
        defs[f"l{i}"] = {"maxLength": 9, "anyOf": [{"$ref": f"#/$defs/l{i - 1}"}, {"$ref": f"#/$defs/l{i - 1}"}]}
    with pytest.raises(GrammarError, match="rewriting the schema"):
        rewrite({"$defs": defs, "$ref": "#/$defs/l29", "minLength": 1}, ENFORCED_FORMATS)


# -- through the backend: strict now compiles, and enforces -------------------------------------

def test_rewritten_schemas_compile_strict_and_are_enforced():
    backend = make_backend()
    schema = {"type": "object", "additionalProperties": False,
              "properties": {"code": {"type": "string", "pattern": "^[A-Z]+$", "maxLength": 3},
                             "n": {"allOf": [{"type": "integer"}, {"minimum": 1, "maximum": 5}]}},
              "required": ["code", "n"]}
    assert find_unsupported(schema)  # refused before the rewrite
    compiled = backend.compile(make_constraint(spec=json.dumps(schema)))
    assert accepts(compiled, '{"code":"ABC","n":5}')
    assert not accepts(compiled, '{"code":"ABCD","n":5}')
    assert not accepts(compiled, '{"code":"AB","n":6}')


def test_unknown_format_compiles_strict_with_a_note():
    compiled = make_backend().compile(make_constraint(spec=json.dumps({"type": "string", "format": "color"})))
    assert compiled.not_enforced == ["format 'color' at / (the root) is an annotation, not checked"]


def test_positional_keywords_are_not_moved_next_to_the_other_sides():
    with pytest.raises(CannotMerge):
        merge({"prefixItems": [{"type": "integer"}]}, {"items": {"minimum": 5}})
    with pytest.raises(CannotMerge):
        merge({"properties": {"foo": True}}, {"unevaluatedProperties": False})
    assert merge({"items": {"type": "integer"}}, {"items": {"minimum": 1}}) == {"items": {"type": "integer", "minimum": 1}}


def test_not_integer_is_left_alone_because_number_would_admit_integers():
    assert rewritten({"not": {"type": "integer"}}) == {"not": {"type": "integer"}}


@pytest.mark.parametrize("schema, expected", [
    ({"type": "object", "properties": {"foo": {"type": "array"}}, "patternProperties": {"f.o": {"type": "string"}}},
     ["patternProperties at / (the root)"]),
    ({"type": "object", "patternProperties": {"a*": {"type": "integer"}, "aaa*": {"type": "number", "maximum": 20}}},
     ["patternProperties at / (the root)"]),
    ({"type": "object", "properties": {"bar": {}}, "patternProperties": {"^x-": {"type": "string"}}}, []),
    ({"type": "object", "properties": {"bar": {"type": "string"}}, "patternProperties": {".*": {"type": "string"}}},
     []),  # the same schema either way
])
def test_checker_flags_names_that_several_property_schemas_match(schema, expected):
    # measured: xgrammar checks such a name against one of the schemas, not all
    assert [str(f) for f in find_unsupported(schema)] == expected


def test_empty_branches_are_dropped_and_a_node_without_any_is_false():
    schema = {"anyOf": [{"type": "string"}, {"type": "array", "anyOf": [{"type": "string"}]}]}
    assert rewritten(schema) == {"type": "string"}
    assert rewritten({"type": "array", "anyOf": [{"type": "string"}, {"type": "null"}]}) is False


def test_a_self_referencing_target_is_inlined_once_when_its_inner_references_are_bare():
    schema = {"$defs": {"list": {"type": "array", "items": {"$ref": "#/$defs/list"}}},
              "$ref": "#/$defs/list", "maxItems": 1}
    assert rewritten(schema) == {"$defs": schema["$defs"], "type": "array", "items": {"$ref": "#/$defs/list"},
                                 "maxItems": 1}


def test_one_of_that_differs_only_in_required_becomes_exclusive_alternatives():
    props = {"r": {"type": "number"}, "l": {"type": "number"}, "w": {"type": "number"}}
    schema = {"type": "object", "properties": props, "additionalProperties": False,
              "oneOf": [{"required": ["r"]}, {"required": ["l", "w"]}]}
    result = rewrite(schema, ENFORCED_FORMATS)
    closed = {"type": "object", "additionalProperties": False}
    # r without l, r without w; l and w without r
    assert result.schema == {"anyOf": [
        {**closed, "properties": {"r": props["r"], "w": props["w"]}, "required": ["r"]},
        {**closed, "properties": {"r": props["r"], "l": props["l"]}, "required": ["r"]},
        {**closed, "properties": {"l": props["l"], "w": props["w"]}, "required": ["l", "w"]}]}
    assert not [n for n in result.narrowed if n.startswith("oneOf")]  # the object was closed already


def test_a_one_of_whose_branches_overlap_is_written_exactly_not_narrowed():
    # "x" matches both branches, so it is invalid; an object without "a" matches neither. The
    # branches are not narrowed (that could widen the oneOf): each is kept apart from the other
    schema = {"oneOf": [{"required": ["a"]}, {"type": "string"}]}
    result = rewrite(schema, ENFORCED_FORMATS)
    assert result.schema == {"required": ["a"], "type": ["null", "boolean", "object", "array", "number"],
                             "properties": {"a": True}}
    assert result.narrowed == []


@pytest.mark.parametrize("schema", [
    {"not": {"required": ["a"]}},  # rejects every non-object
    {"type": "array", "contains": {"required": ["a"]}},
    {"$defs": {"d": {"required": ["a"]}}, "not": {"$ref": "#/$defs/d"}},
])
def test_no_narrowing_where_it_would_widen_the_parent(schema):
    assert rewritten(schema) == schema


def test_a_number_that_is_a_multiple_of_a_whole_number_is_an_integer():
    assert rewritten({"type": "number", "multipleOf": 1.0}) == {"type": "integer", "multipleOf": 1}
    assert rewritten({"type": "number", "multipleOf": 0.5}) == {"type": "number", "multipleOf": 0.5}


def test_only_the_definitions_a_negated_place_reaches_are_kept_from_narrowing():
    # free is referenced from a plain property only: its type may be inferred (a narrowing);
    # negated is under a not, and chained through it, so neither is narrowed
    schema = {"type": "object",
              "$defs": {"free": {"required": ["a"]}, "negated": {"$ref": "#/$defs/chained"},
                        "chained": {"required": ["c"]}},
              "properties": {"x": {"$ref": "#/$defs/free"}, "y": {"not": {"$ref": "#/$defs/negated"}}}}
    defs = rewritten(schema)["$defs"]
    assert defs["free"]["type"] == "object"
    assert "type" not in defs["chained"] and defs["negated"] == {"$ref": "#/$defs/chained"}
