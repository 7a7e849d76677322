"""`uniqueItems` over arrays of free strings, moved out of the schema into a path tree that the
runtime check (grammar/runtime/unique_strings.py) follows while the output is written.

No grammar can say "distinct strings", but a mask can: a token that would close an element equal
to an earlier one of the same array is not allowed. That is exact, and never leaves the output
stuck, only where every element may be any string of at least minLength characters (no
maxLength, pattern, format, enum or const): whatever has been written of an element, some
continuation makes it new. And the check must know which arrays of the output are those: here,
only where the instance path alone tells. Every schema that holds a uniqueItems is reached from
the root through `properties`, `additionalProperties`, `items`, local `$ref`s and `allOf` (which
all apply), or through the branches of an `anyOf`/`oneOf` that mark the same arrays whichever
holds (a branch of scalars only marks nothing: where it holds, no array is there); never through a `not`, `if`, pattern, tuple or dependency. Otherwise nothing is taken
out, and the rewrite and the checker see the schema as before.

Pure JSON -> JSON; the input is not modified.
"""
from __future__ import annotations

import json
from typing import Any

from grammar.json_schema.one_of import instance_types
from grammar.json_schema.rule import asserting
from grammar.json_schema.walk import iter_subschemas, resolve_pointer

_ARRAY_KEYWORDS = {"type", "items", "minItems", "maxItems", "uniqueItems"}
_STRING_KEYWORDS = {"type", "minLength"}
# keywords that assert nothing of an array (a string's length on an array says nothing), and of a string
_NOT_OF_ARRAYS = {"minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
                  "exclusiveMaximum", "multipleOf", "required", "minProperties", "maxProperties"}
_NOT_OF_STRINGS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "required",
                   "minProperties", "maxProperties", "minItems", "maxItems", "uniqueItems"}
# keywords whose subschemas apply to an instance only under a condition or alongside another
_BRANCHING = ("anyOf", "oneOf", "allOf", "not", "if", "then", "else", "patternProperties", "prefixItems",
              "additionalItems", "contains", "dependentSchemas", "dependencies", "propertyNames",
              "unevaluatedProperties", "unevaluatedItems")


def runtime_unique_strings(schema: Any) -> tuple[Any, dict] | None:
    """(the schema without the uniqueItems the runtime check takes over, the path tree from the
    root to those arrays), or None where there is none it can take (see the module docstring)."""
    if not isinstance(schema, dict):
        return None
    nodes = [(p, node) for p, node, _ in iter_subschemas(schema) if isinstance(node, dict)]
    sites = [p for p, node in nodes if is_site(node, schema)]
    if not sites or any(_unfollowed_reference(node) for _, node in nodes):
        return None
    try:
        tree = _PathTree(schema).node(schema)
    except _PathUnknown:
        return None
    if tree is None:
        return None
    out = json.loads(json.dumps(schema))
    for pointer in sites:
        del _at(out, pointer)["uniqueItems"]
    return out, tree


def _unfollowed_reference(node: dict) -> bool:
    """A reference the path tree cannot follow: dynamic, recursive, to an anchor or another document."""
    ref = node.get("$ref")
    return "$dynamicRef" in node or "$recursiveRef" in node or (
        ref is not None and not (isinstance(ref, str) and (ref == "#" or ref.startswith("#/"))))


def is_site(node: Any, root: dict) -> bool:
    """An array of free strings that must be distinct (references resolved against `root`)."""
    if not isinstance(node, dict) or node.get("uniqueItems") is not True or node.get("type") != "array":
        return False
    if set(asserting(node)) - _ARRAY_KEYWORDS - _NOT_OF_ARRAYS:
        return False
    items = _follow(node.get("items", True), root)
    if not isinstance(items, dict) or items.get("type") != "string":
        return False
    return not set(asserting(items)) - _STRING_KEYWORDS - _NOT_OF_STRINGS


def _follow(node: Any, root: dict) -> Any:
    """A bare local $ref's target (one step), else the node."""
    if isinstance(node, dict) and isinstance(node.get("$ref"), str) and not asserting(node, "$ref"):
        return resolve_pointer(root, node["$ref"]) if node["$ref"].startswith("#/") else None
    return node


class _HoldsUnique:
    """Whether a schema, references followed, holds a uniqueItems anywhere (memoized per schema
    and per reference; a cycle of references is searched whole, never cut short)."""

    def __init__(self, root: dict) -> None:
        self.root = root
        self.refs: dict[str, bool] = {}
        self.schemas: dict[int, tuple[Any, bool]] = {}  # id -> (the schema, kept alive; the answer)

    def __call__(self, schema: Any) -> bool:
        if not isinstance(schema, (dict, list)):
            return False
        if id(schema) not in self.schemas:
            direct, refs = _scan(schema)
            self.schemas[id(schema)] = (schema, direct or any(self._ref(r) for r in refs))
        return self.schemas[id(schema)][1]

    def _ref(self, ref: str) -> bool:
        """Whether the target of `ref`, or of a reference reached from it, holds one."""
        if ref in self.refs:
            return self.refs[ref]
        seen, todo = {ref}, [ref]
        while todo:
            current = todo.pop()
            if self.refs.get(current) is True:
                break
            if not current.startswith("#/") and current != "#":
                break  # another document: it may hold one
            direct, refs = _scan(resolve_pointer(self.root, current))
            if direct:
                break
            todo += [r for r in refs if r not in seen]
            seen |= set(refs)
        else:
            self.refs.update(dict.fromkeys(seen, False))  # each one's closure is part of this one's
            return False
        self.refs[ref] = True
        return True


def _scan(schema: Any) -> tuple[bool, list[str]]:
    """(whether a uniqueItems is in `schema` itself, the references in it)."""
    direct, refs = False, []
    for _, node, _ in iter_subschemas(schema if not isinstance(schema, list) else {"anyOf": schema}):
        if isinstance(node, dict):
            direct = direct or "uniqueItems" in node
            if isinstance(node.get("$ref"), str):
                refs.append(node["$ref"])
    return direct, refs


class _PathUnknown(Exception):
    """A uniqueItems that the instance path alone does not tie to the arrays it applies to."""


class _PathTree:
    """The path tree's nodes: {"unique", "properties", "additional", "items"}; None where no
    array of distinct strings lies below. A recursive schema gives a cyclic tree.

    Subschemas that apply beside each other (allOf, a $ref with keywords beside it) add their
    trees up: an array is unique if any of them says so. Branches of which one holds (anyOf,
    oneOf) must give equal trees, each with the node's own: then which one holds does not
    matter. Anything else that holds a uniqueItems (not, if, patterns, tuples, dependencies...)
    raises _PathUnknown."""

    def __init__(self, root: dict) -> None:
        self.root = root
        self.holds = _HoldsUnique(root)
        self.refs: dict[str, dict | None] = {}
        self.sums: dict[tuple[int, int], tuple[dict, dict, dict]] = {}

    def node(self, schema: Any) -> dict | None:
        if not isinstance(schema, dict) or not self.holds(schema):
            return None
        ref = schema.get("$ref")
        if isinstance(ref, str) and not asserting(schema, "$ref"):  # bare, but for annotations
            if ref not in self.refs:
                # pending until built: a recursive reference inside it sees it incomplete
                self.refs[ref] = placeholder = {"unique": False, "properties": {}, "additional": None, "items": None,
                                                "pending": True}
                target = self.node(resolve_pointer(self.root, ref))
                placeholder.update(target or {})
                del placeholder["pending"]
                self.refs[ref] = placeholder if target is not None else None
            return self.refs[ref]
        for key in _BRANCHING:
            if key in schema and key not in (*_COMBINED, "patternProperties") and self._holds_any(schema[key], key):
                raise _PathUnknown(key)
        if isinstance(schema.get("items"), list) and self._holds_any(schema["items"], "items"):
            raise _PathUnknown("items")  # a tuple
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        own: dict | None = {"unique": is_site(schema, self.root),
                            "properties": {n: self.node(s) for n, s in properties.items()},
                            "additional": self._additional(schema),
                            "items": self.node(schema.get("items")) if not isinstance(schema.get("items"), list) else None}
        if "patternProperties" in schema and own is not None:  # a pattern every name matches, beside properties
            pattern_tree = own["additional"]
            own["properties"] = {n: self.sum(t, pattern_tree) for n, t in own["properties"].items()}
        if isinstance(ref, str):
            own = self.sum(own, self.node({"$ref": ref}))
        for branch in schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []:
            own = self.sum(own, self.node(branch))
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            if isinstance(branches, list) and self._holds_any(branches):
                # a branch of scalars only holds where the value is no array or object: no path goes through it
                containers = [b for b in branches if _may_contain(_follow(b, self.root))]
                trees = [self.sum(own, self.node(b)) for b in containers] or [own]
                if not all(_equal(trees[0], t) for t in trees[1:]):
                    raise _PathUnknown(key)
                own = trees[0]
        return own

    def _additional(self, schema: dict) -> dict | None:
        """The tree for the names beyond `properties`: additionalProperties', or that of the one
        pattern that matches every name there may be (for "." every name but "", which a false
        additionalProperties keeps out); any other pattern holding a uniqueItems is unknown."""
        patterns = schema.get("patternProperties")
        additional = schema.get("additionalProperties")
        if patterns is None or not self._holds_any(patterns):
            if patterns is not None and self.holds(additional):
                raise _PathUnknown("additionalProperties")  # it does not apply to the names a pattern matches
            return self.node(additional)
        if not isinstance(patterns, dict) or len(patterns) != 1:
            raise _PathUnknown("patternProperties")
        (pattern, subschema), = patterns.items()
        if not (pattern in _EVERY_NAME or (pattern in _EVERY_NONEMPTY_NAME and additional is False
                                           and "" not in schema.get("properties", {}))):
            raise _PathUnknown("patternProperties")
        return self.node(subschema)

    def sum(self, a: dict | None, b: dict | None) -> dict | None:
        """The tree of two schemas that both apply."""
        if a is None or b is None or a is b:
            return a if b is None else b
        _complete(a, b)
        key = (id(a), id(b))
        if key not in self.sums:
            out = {"unique": False, "properties": {}, "additional": None, "items": None}
            self.sums[key] = (a, b, out)  # a and b kept alive, so that their ids stay theirs
            names = dict.fromkeys([*a["properties"], *b["properties"]])
            out.update(unique=a["unique"] or b["unique"],
                       properties={n: self.sum(_view(a, n), _view(b, n)) for n in names},
                       additional=self.sum(a["additional"], b["additional"]),
                       items=self.sum(a["items"], b["items"]))
        return self.sums[key][2]

    def _holds_any(self, value: Any, key: str = "patternProperties") -> bool:
        """Whether a subschema of keyword `key` (a list, a map of them, or one) holds a uniqueItems."""
        if isinstance(value, dict) and key in _SCHEMA_MAPS:
            subschemas = list(value.values())
        else:
            subschemas = value if isinstance(value, list) else [value]
        return any(self.holds(s) for s in subschemas)


_COMBINED = ("allOf", "anyOf", "oneOf")
_SCHEMA_MAPS = ("patternProperties", "dependentSchemas", "dependencies")  # name -> schema
_EVERY_NAME = ("", ".*", "^.*$", "^.*")
_EVERY_NONEMPTY_NAME = (".", ".+", "^.+$", "^.+", "^.")


def _may_contain(schema: Any) -> bool:
    """Whether a value valid against `schema` may be an array or an object."""
    types = instance_types(schema)
    return types is None or bool(types & {"array", "object"})


def _complete(*trees: dict) -> None:
    """A tree still being built (a recursive reference met inside itself) cannot be compared or
    added up yet: what it will mark is not known."""
    if any(t.get("pending") for t in trees):
        raise _PathUnknown("a recursive reference inside a combination")


def _view(tree: dict, name: str) -> dict | None:
    return tree["properties"][name] if name in tree["properties"] else tree["additional"]


def _equal(a: dict | None, b: dict | None, seen: set | None = None) -> bool:
    """Whether two path trees mark the same arrays (cycles followed once)."""
    if a is None or b is None or a is b:
        return a is b or _marks_nothing(a if b is None else b)
    _complete(a, b)
    seen = set() if seen is None else seen
    if (id(a), id(b)) in seen:
        return True
    seen.add((id(a), id(b)))
    names = dict.fromkeys([*a["properties"], *b["properties"]])
    return (a["unique"] == b["unique"] and all(_equal(_view(a, n), _view(b, n), seen) for n in names)
            and _equal(a["additional"], b["additional"], seen) and _equal(a["items"], b["items"], seen))


def _marks_nothing(tree: dict | None, seen: set | None = None) -> bool:
    if tree is None:
        return True
    seen = set() if seen is None else seen
    if id(tree) in seen:
        return True
    _complete(tree)
    seen.add(id(tree))
    return not tree["unique"] and all(_marks_nothing(t, seen) for t in
                                      (*tree["properties"].values(), tree["additional"], tree["items"]))


def _at(root: Any, pointer: str) -> Any:
    return resolve_pointer(root, "#" + pointer) if pointer else root
