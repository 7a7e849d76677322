"""Whether every instance of a schema must contain itself, read from the schema: the parts an
instance cannot leave out (a required property of an object, an array's first minItems items,
every allOf member, what a $ref names) followed from the root; one that leads back to a part on the
way has no finite instance. Only what is certain counts: a part an instance may avoid (an optional
property, an anyOf branch, a schema that allows another type) ends the search there."""
from __future__ import annotations

from typing import Any

from grammar.json_schema.walk import first_cycle, pointer_join, resolve_pointer


def forced_cycle(schema: Any) -> str | None:
    """The pointer of a part every instance must contain and that must contain itself, or None."""
    nodes = {"": schema}

    def forced_pointers(pointer: str) -> list[str]:
        parts = _forced_parts(nodes[pointer], pointer, schema)
        nodes.update(parts)
        return [part_pointer for part_pointer, _ in parts]

    return first_cycle([""], forced_pointers)


def _forced_parts(node: Any, pointer: str, root: Any) -> list[tuple[str, Any]]:
    """(pointer, subschema) of each part every instance of `node` contains."""
    if not isinstance(node, dict) or "enum" in node or "const" in node:
        return []
    parts: list[tuple[str, Any]] = []
    ref = node.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
        target = resolve_pointer(root, ref)
        if target is not None:
            parts.append((ref[1:], target))
    members = node.get("allOf")
    if isinstance(members, list):
        parts += [(pointer_join(pointer, "allOf", i), member) for i, member in enumerate(members)]
    kind = node.get("type")
    properties = node.get("properties")
    required = node.get("required")
    if kind == "object" and isinstance(properties, dict) and isinstance(required, list):
        parts += [(pointer_join(pointer, "properties", name), properties[name]) for name in required
                  if isinstance(name, str) and name in properties]
    min_items = node.get("minItems")
    if kind == "array" and isinstance(min_items, int) and min_items > 0:
        prefix = node.get("prefixItems") if isinstance(node.get("prefixItems"), list) else []
        parts += [(pointer_join(pointer, "prefixItems", i), item) for i, item in enumerate(prefix[:min_items])]
        if len(prefix) < min_items and isinstance(node.get("items"), dict):
            parts.append((pointer_join(pointer, "items"), node["items"]))
    return parts
