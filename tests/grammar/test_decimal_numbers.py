"""grammar/xgrammar/decimal_numbers.py: multipleOf 10^-k on numbers as at most k fraction digits."""
from __future__ import annotations

import copy

import pytest

from grammar.xgrammar.decimal_numbers import fraction_digits, mark, number_rule, substitute

CENTS = '("-"? ("0" | [1-9] [0-9]*) ("." [0-9]{1, 2})?)'


@pytest.mark.parametrize(("multiple", "digits"), [
    (0.1, 1), (0.01, 2), (0.001, 3), (1e-6, 6),
    (0.25, None), (0.5, None), (0.02, None), (1.0, None), (1, None), (True, None), ("0.01", None),
])
def test_only_a_power_of_ten_below_one_has_a_number_of_fraction_digits(multiple, digits):
    assert fraction_digits(multiple) == digits


def test_the_number_rule_allows_k_fraction_digits_and_no_exponent():
    assert number_rule({"type": "number", "multipleOf": 0.01, "title": "price"}) == CENTS
    assert number_rule({"type": "number", "multipleOf": 0.1, "minimum": 0}) == \
        '(("0" | [1-9] [0-9]*) ("." [0-9]{1, 1})?)'
    # 99999999999.99 is the largest number of 11 integer digits and 2 fraction digits
    assert number_rule({"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 99999999999.99}) == \
        '(("0" | [1-9] [0-9]{0, 10}) ("." [0-9]{1, 2})?)'


@pytest.mark.parametrize("node", [
    {"type": "number", "multipleOf": 0.25},
    {"type": "integer", "multipleOf": 0.01},
    {"type": "number", "multipleOf": 0.01, "minimum": 1},
    {"type": "number", "multipleOf": 0.01, "maximum": 99.99},  # a maximum with no minimum
    {"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 100},
    {"type": "number", "multipleOf": 0.01, "exclusiveMinimum": 0},
    {"type": "number", "multipleOf": 0.01, "enum": [1.5]},
])
def test_bounds_and_keywords_the_rule_cannot_carry_leave_the_node_alone(node):
    assert number_rule(node) is None


def test_mark_replaces_only_numbers_where_narrowing_them_narrows_the_schema():
    cents = {"type": "number", "multipleOf": 0.01}
    schema = {"type": "object", "properties": {
        "price": cents,
        "discount": {"type": ["number", "null"], "multipleOf": 0.01},
        "either": {"oneOf": [cents, {"type": "integer"}]},
        "never": {"not": cents},
        "ratio": {"type": "number", "multipleOf": 0.25}}}
    before = copy.deepcopy(schema)
    marked, rules = mark(schema)
    assert schema == before
    assert marked["properties"]["price"] == {"const": "__formwork_decimal_0__"}
    assert marked["properties"]["discount"] == {"anyOf": [{"const": "__formwork_decimal_1__"}, {"type": "null"}]}
    assert marked["properties"]["either"] == before["properties"]["either"]
    assert marked["properties"]["never"] == before["properties"]["never"]
    assert marked["properties"]["ratio"] == before["properties"]["ratio"]
    assert rules == {"__formwork_decimal_0__": CENTS, "__formwork_decimal_1__": CENTS}


def test_definitions_a_oneof_refers_to_are_left_alone():
    schema = {"$defs": {"cents": {"type": "number", "multipleOf": 0.01}},
              "oneOf": [{"$ref": "#/$defs/cents"}, {"type": "string"}]}
    assert mark(schema) == (schema, {})
    plain = {"$defs": {"cents": {"type": "number", "multipleOf": 0.01}}, "items": {"$ref": "#/$defs/cents"}}
    assert mark(plain)[0]["$defs"]["cents"] == {"const": "__formwork_decimal_0__"}


def test_substitute_replaces_the_marker_literal_and_refuses_a_marker_joined_with_other_text():
    rules = {"__formwork_decimal_0__": CENTS}
    text = 'root ::= (("\\"__formwork_decimal_0__\\""))\n'
    assert substitute(text, rules) == f"root ::= (({CENTS}))\n"
    assert substitute('root ::= (("[\\"__formwork_decimal_0__\\""))\n', rules) is None


@pytest.mark.parametrize(("schema", "texts"), [
    ({"type": "number", "multipleOf": 0.01},
     {"12.34": True, "0": True, "-3.5": True, "3": True, "12.345": False, "1e2": False, "0.100": False,
      "007": False, "12.": False}),
    ({"type": "object", "properties": {"p": {"type": ["number", "null"], "multipleOf": 0.01}}, "required": ["p"]},
     {'{"p":null}': True, '{"p":1.25}': True, '{"p":1.255}': False, '{"p":"1.25"}': False}),
    ({"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 99.99},
     {"99.99": True, "0": True, "5.5": True, "100": False, "-1": False}),
])
def test_strict_mode_enforces_the_number_rule(schema, texts):
    from grammar_factories import accepts, make_backend, make_constraint

    compiled = make_backend().compile(make_constraint(spec=schema, strict=True))
    assert {text: accepts(compiled, text) for text in texts} == texts


def test_a_multiple_the_rule_cannot_enforce_is_still_refused():
    from grammar.backend import GrammarError
    from grammar_factories import make_backend, make_constraint

    with pytest.raises(GrammarError, match="multipleOf"):
        make_backend().compile(make_constraint(spec={"type": "number", "multipleOf": 0.25}, strict=True))
