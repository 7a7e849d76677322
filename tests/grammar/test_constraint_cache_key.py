"""Constraint.cache_key: the grammar cache must not mix up schemas that compile differently."""
from __future__ import annotations

from grammar.constraint import Constraint


def schema(text: str, **options) -> Constraint:
    return Constraint(kind="json_schema", spec=text, **options)


def test_whitespace_does_not_matter():
    assert schema('{"type": "object",\n "properties": {"a": {}}}').cache_key == \
        schema('{"type":"object","properties":{"a":{}}}').cache_key


def test_property_order_matters():
    # the order properties are declared in is the order they are generated in
    assert schema('{"properties": {"b": {}, "a": {}}, "required": ["a", "b"]}').cache_key != \
        schema('{"properties": {"a": {}, "b": {}}, "required": ["a", "b"]}').cache_key


def test_options_matter():
    keys = [schema("{}").cache_key, schema("{}", strict=False).cache_key, schema("{}", any_whitespace=True).cache_key,
            schema("{}", strict=False, any_whitespace=True).cache_key]
    assert len(set(keys)) == len(keys)  # every pair differs
