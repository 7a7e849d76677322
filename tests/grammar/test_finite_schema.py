"""grammar/json_schema/finite.py: a schema every instance of which must contain itself."""
from __future__ import annotations

import pytest

from grammar.json_schema.finite import forced_cycle

LIST_NODE = {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}, "required": ["next"]}


@pytest.mark.parametrize("schema, cycle", [
    ({"type": "object", "properties": {"child": {"$ref": "#"}}, "required": ["child"]}, ""),
    ({"$defs": {"node": LIST_NODE}, "type": "array", "minItems": 1, "items": {"$ref": "#/$defs/node"}}, "/$defs/node"),
    ({"allOf": [{"$ref": "#"}]}, ""),
    # an instance may leave the loop: an optional property, an anyOf branch, another type, an empty array
    ({"type": "object", "properties": {"child": {"$ref": "#"}}}, None),
    ({"type": "object", "properties": {"child": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["child"]},
     None),
    ({"type": ["object", "null"], "properties": {"child": {"$ref": "#"}}, "required": ["child"]}, None),
    ({"$defs": {"node": LIST_NODE}, "type": "array", "items": {"$ref": "#/$defs/node"}}, None),
    ({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"$ref": "#/properties/a"}},
                                             "required": ["b"]}}}, None),  # never-ending only once "a" is written
])
def test_a_part_every_instance_contains_that_contains_itself_is_found(schema, cycle):
    assert forced_cycle(schema) == cycle
