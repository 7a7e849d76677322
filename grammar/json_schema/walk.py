"""Walking a JSON schema: the keyword vocabulary, every nested subschema with its JSON pointer,
and local references. Pure JSON; every reader of a schema's structure walks it with this."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

# Keywords that assert something about an instance, in any draft. Keywords outside this set
# (annotations like "title", identifiers like "$id", vendor extensions) never constrain output.
ASSERTIONS = frozenset({
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "format", "maxItems", "minItems", "uniqueItems", "maxContains",
    "minContains", "maxProperties", "minProperties", "required", "dependentRequired",
    "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "dependencies",
    "prefixItems", "items", "additionalItems", "contains", "properties", "patternProperties",
    "additionalProperties", "propertyNames", "unevaluatedItems", "unevaluatedProperties",
    "$ref", "$dynamicRef", "$recursiveRef",
})

APPLICATORS = ("allOf", "anyOf", "oneOf")
SUBSCHEMA_MAP_KEYWORDS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SINGLE_SUBSCHEMA_KEYWORDS = ("additionalProperties", "items", "contains", "propertyNames", "not", "if",
                             "then", "else", "unevaluatedItems", "unevaluatedProperties", "additionalItems",
                             "contentSchema")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")


def pointer_join(pointer: str, *tokens: str | int) -> str:
    """Extend a JSON pointer, escaping "~" and "/" as RFC 6901 says."""
    for token in tokens:
        pointer += "/" + str(token).replace("~", "~0").replace("/", "~1")
    return pointer


def iter_subschemas(schema: Any, pointer: str = "") -> Iterator[tuple[str, Any, int]]:
    """Yield (pointer, schema, depth) for `schema` and every schema nested in it, root first.

    Iterative, so a hostile schema cannot exhaust Python's recursion limit. `depth` counts
    schema levels (the root is 1), not JSON brackets.
    """
    stack: list[tuple[str, Any, int]] = [(pointer, schema, 1)]
    while stack:
        ptr, node, depth = stack.pop()
        yield ptr, node, depth
        if not isinstance(node, dict):
            continue
        children: list[tuple[str, Any]] = []
        for key in SUBSCHEMA_MAP_KEYWORDS:
            value = node.get(key)
            if isinstance(value, dict):
                children += [(pointer_join(ptr, key, name), sub) for name, sub in value.items()]
        for key in SINGLE_SUBSCHEMA_KEYWORDS:
            value = node.get(key)
            if isinstance(value, (dict, bool)):
                children.append((pointer_join(ptr, key), value))
        for key in _SCHEMA_LISTS:
            value = node.get(key)
            if isinstance(value, list):
                children += [(pointer_join(ptr, key, i), sub) for i, sub in enumerate(value)]
        deps = node.get("dependencies")
        if isinstance(deps, dict):  # draft 7: name -> schema or list of names
            children += [(pointer_join(ptr, "dependencies", n), s) for n, s in deps.items()
                         if isinstance(s, (dict, bool))]
        stack.extend((p, s, depth + 1) for p, s in reversed(children))


def resolve_pointer(root: Any, ref: str) -> Any:
    """The subschema a local "#/..." reference names, or None."""
    node = root
    for token in ref[2:].split("/") if ref.startswith("#/") else []:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node



def first_cycle(starts: Iterable[str], next_of: Callable[[str], Iterable[str]]) -> str | None:
    """A node that leads back to itself, following `next_of` depth-first (iteratively) from each of
    `starts`, or None."""
    done: set[str] = set()
    for start in starts:
        if start in done:
            continue
        path, stack = {start}, [(start, iter(next_of(start)))]
        while stack:
            node, rest = stack[-1]
            step = next(rest, None)
            if step is None:
                stack.pop()
                path.discard(node)
                done.add(node)
            elif step in path:
                return step
            elif step not in done:
                path.add(step)
                stack.append((step, iter(next_of(step))))
    return None


def has_reference_cycle(schema: Any) -> bool:
    """Whether a schema may refer to itself: a local $ref leads, through the subschema it names, to
    a $ref back into it (only such a schema can have a part that never ends). True as well for any
    reference this cannot follow (an anchor, another document)."""
    references = [(pointer, node["$ref"]) for pointer, node, _ in iter_subschemas(schema)
                  if isinstance(node, dict) and isinstance(node.get("$ref"), str)]
    if any(ref != "#" and not ref.startswith("#/") for _, ref in references):
        return True
    targets = {ref[1:] for _, ref in references}  # JSON pointers, "" the root

    def inside(pointer: str, target: str) -> bool:
        return target == "" or pointer == target or pointer.startswith(target + "/")

    following = {target: {ref[1:] for pointer, ref in references if inside(pointer, target)} for target in targets}
    return first_cycle(targets, lambda target: following.get(target, ())) is not None
