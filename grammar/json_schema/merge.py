"""The conjunction of two JSON schemas as one schema: what `allOf: [a, b]` means, written flat.

`merge(a, b)` returns a schema whose valid instances are exactly those valid against both `a`
and `b` (draft 2020-12 semantics), or raises CannotMerge when the two cannot be written as one
schema this module knows to be exact (two different patterns, an `anyOf` beside a `oneOf`, keywords it
does not model...). It never returns something looser; the caller keeps the original when it cannot merge.

Pure JSON -> JSON; the inputs are not modified. `$ref`s must be resolved by the caller.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any


class CannotMerge(Exception):
    """The two schemas have no exact single-schema conjunction here; the message says why."""


class EmptyIntersection(CannotMerge):
    """No instance is valid against both schemas (disjoint types, disjoint enums...)."""


TYPES = ("null", "boolean", "object", "array", "string", "number", "integer")
# Keywords that assert nothing; the merged schema keeps the first side's.
ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly",
    "$schema", "$id", "id", "$anchor", "contentEncoding", "contentMediaType", "markdownDescription",
})
# Keywords whose meaning depends on their neighbours in the same schema object (items after
# prefixItems, minContains with contains, then with if, unevaluated* with everything evaluated
# beside them): moving one next to another side's keywords would change what it means.
_POSITIONAL = (("prefixItems", "items", "additionalItems", "contains", "minContains", "maxContains"),
               ("if", "then", "else"))
_ANY_SIDE = ("unevaluatedProperties", "unevaluatedItems")
MAX_PRODUCT_BRANCHES = 16  # two anyOfs (or oneOfs) merged into at most this many branches
_LOWER_BOUNDS = ("minLength", "minItems", "minProperties", "minimum", "exclusiveMinimum")
_UPPER_BOUNDS = ("maxLength", "maxItems", "maxProperties", "maximum", "exclusiveMaximum")


def copy_json(value: Any) -> Any:
    return json.loads(json.dumps(value))


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def declared_types(schema: dict) -> set[str] | None:
    """The set of instance types `schema["type"]` allows (integer spelled out); None: any."""
    declared = schema.get("type")
    if declared is None:
        return None
    names = [declared] if isinstance(declared, str) else declared
    if not isinstance(names, list) or not all(isinstance(t, str) and t in TYPES for t in names):
        raise CannotMerge(f"unreadable type {declared!r}")
    out = set(names)
    if "number" in out:
        out.add("integer")
    return out


def type_value(types: set[str]) -> str | list[str]:
    """The shortest "type" value naming exactly `types`."""
    names = [t for t in TYPES if t in types and not (t == "integer" and "number" in types)]
    return names[0] if len(names) == 1 else names


def merge(a: Any, b: Any) -> Any:
    """The schema valid exactly where both `a` and `b` are; raises CannotMerge (see module doc)."""
    if a is False or b is False:
        raise EmptyIntersection("a false schema accepts nothing")
    if b is True or b == {}:
        return copy_json(a)
    if a is True or a == {}:
        return copy_json(b)
    if a == b:
        return copy_json(a)  # x and x is x, whatever x holds ($refs included)
    if not isinstance(a, dict) or not isinstance(b, dict):
        raise CannotMerge("a subschema is neither an object nor a boolean")
    if "$ref" in a or "$ref" in b:
        raise CannotMerge("unresolved $ref")
    if "allOf" in a or "allOf" in b:
        raise CannotMerge("nested allOf")
    for key in _ANY_SIDE:
        if key in a or key in b:
            raise CannotMerge(f"{key} depends on where it sits")
    for group in _POSITIONAL:
        in_a, in_b = [k for k in group if k in a], [k for k in group if k in b]
        if in_a and in_b and not (in_a == in_b == ["items"]):
            raise CannotMerge(f"{'/'.join(in_a)} beside {'/'.join(in_b)}")
    for fixed in (a, b):
        if "enum" in fixed or "const" in fixed:
            return _merge_fixed(fixed, b if fixed is a else a)
    out: dict[str, Any] = {k: v for k, v in a.items() if k in ANNOTATIONS}
    keys = [k for k in (*a, *b) if k not in ANNOTATIONS]
    for key in dict.fromkeys(keys):
        if key in ("type", "properties", "additionalProperties", "items"):
            continue  # merged below
        in_a, in_b = key in a, key in b
        value = a[key] if in_a else b[key]
        if in_a and in_b and a[key] != b[key]:
            value = _merge_keyword(key, a[key], b[key])
        out[key] = copy_json(value)
    types_a, types_b = declared_types(a), declared_types(b)
    if types_a is not None or types_b is not None:
        types = (types_a or set(TYPES)) & (types_b or set(TYPES))
        if not types:
            raise EmptyIntersection(f"types {a['type']!r} and {b['type']!r} are disjoint")
        out["type"] = type_value(types)
    _merge_object_keywords(a, b, out)
    if "items" in a or "items" in b:
        if isinstance(a.get("items"), list) or isinstance(b.get("items"), list):
            raise CannotMerge("tuple items")
        out["items"] = merge(a.get("items", True), b.get("items", True))
    _check_bounds(out)
    return out


def _merge_keyword(key: str, x: Any, y: Any) -> Any:
    if key in _LOWER_BOUNDS or key in _UPPER_BOUNDS:
        if isinstance(x, bool) or isinstance(y, bool) or not all(isinstance(v, (int, float)) for v in (x, y)):
            raise CannotMerge(f"non-numeric {key}")
        return max(x, y) if key in _LOWER_BOUNDS else min(x, y)
    if key == "required":
        if not isinstance(x, list) or not isinstance(y, list):
            raise CannotMerge("required is not a list")
        return list(dict.fromkeys([*x, *y]))
    if key == "uniqueItems":
        return bool(x) or bool(y)
    if key == "not":  # (not x) and (not y) is not (x or y)
        return {"anyOf": [*_disjuncts(x), *_disjuncts(y)]}
    if key == "multipleOf" and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (x, y)):
        return x * y // math.gcd(x, y)
    if key in ("anyOf", "oneOf") and isinstance(x, list) and isinstance(y, list):
        return _branch_products(x, y)
    raise CannotMerge(f"two different {key} values")


def _branch_products(x: list, y: list) -> list:
    """The branches of (anyOf x) and (anyOf y): every x_i and y_j that meet, merged. The same for
    two oneOfs: exactly one x_i and exactly one y_j hold just where exactly one pair of them does."""
    if len(x) * len(y) > MAX_PRODUCT_BRANCHES:
        raise CannotMerge(f"{len(x)} x {len(y)} branches")
    out = []
    for a in x:
        for b in y:
            try:
                out.append(merge(a, b))
            except EmptyIntersection:
                continue
    if not out:
        raise EmptyIntersection("no two branches meet")
    return out


def _disjuncts(schema: Any) -> list:
    """The branches of a schema that is only an anyOf, else the schema itself."""
    if isinstance(schema, dict) and list(schema) == ["anyOf"] and isinstance(schema["anyOf"], list):
        return list(schema["anyOf"])
    return [schema]


def _property_view(schema: dict, name: str) -> Any:
    """The schema `schema` applies to property `name`: declared, else additionalProperties."""
    properties = schema.get("properties")
    if isinstance(properties, dict) and name in properties:
        return properties[name]
    return schema.get("additionalProperties", True)


def _merge_object_keywords(a: dict, b: dict, out: dict) -> None:
    """properties / additionalProperties of both sides, so that each name sees both sides' rules."""
    if not any(k in s for s in (a, b) for k in ("properties", "additionalProperties")):
        return
    if ("patternProperties" in a or "patternProperties" in b) and not (
            a.get("patternProperties") == b.get("patternProperties") and "additionalProperties" not in a
            and "additionalProperties" not in b):
        raise CannotMerge("patternProperties beside properties")
    for side in (a, b):
        for key in ("properties", "additionalProperties"):
            if key in side and not isinstance(side[key], (dict, bool)):
                raise CannotMerge(f"unreadable {key}")
    names = list(dict.fromkeys([*a.get("properties", {}), *b.get("properties", {})]))
    properties: dict[str, Any] = {}
    required = set(out.get("required", []))
    for name in names:
        try:
            properties[name] = merge(_property_view(a, name), _property_view(b, name))
        except EmptyIntersection:
            if name in required:
                raise
            properties[name] = False  # the name may not appear at all
    if names:
        out["properties"] = properties
    if "additionalProperties" in a or "additionalProperties" in b:
        additional = a.get("additionalProperties", True), b.get("additionalProperties", True)
        try:
            out["additionalProperties"] = merge(*additional)
        except EmptyIntersection:
            out["additionalProperties"] = False
    if any(v is False for v in properties.values()):
        if out.get("additionalProperties") is not False:
            raise CannotMerge("a property that may not appear beside open additionalProperties")
        out["properties"] = {k: v for k, v in properties.items() if v is not False}


def _merge_fixed(fixed: dict, other: dict) -> dict:
    """enum/const beside anything: keep the values both sides accept (exact when `accepts` can tell)."""
    values = fixed["enum"] if "enum" in fixed else [fixed["const"]]
    if not isinstance(values, list):
        raise CannotMerge("enum is not a list")
    rest = {k: v for k, v in fixed.items() if k not in ("enum", "const")}
    kept = [v for v in values if accepts(rest, v) and accepts(other, v)]
    if not kept:
        raise EmptyIntersection("no enum value satisfies both schemas")
    out = {k: v for k, v in fixed.items() if k in ANNOTATIONS}
    out["enum"] = copy_json(kept)  # not const: draft 4 has no const, and the schema may be draft 4
    return out


def accepts(schema: Any, value: Any) -> bool:
    """Whether `value` is valid against `schema`, for the keywords this knows; CannotMerge otherwise."""
    if schema is True:
        return True
    if schema is False:
        return False
    if not isinstance(schema, dict):
        raise CannotMerge("a subschema is neither an object nor a boolean")
    kind = json_type(value)
    for key, limit in schema.items():
        if key in ANNOTATIONS:
            continue
        if key == "type":
            types = declared_types(schema)
            if types is not None and kind not in types and not (kind == "integer" and "number" in types):
                return False
        elif key == "enum":
            if not isinstance(limit, list) or not any(json_equal(value, v) for v in limit):
                return False
        elif key == "const":
            if not json_equal(value, limit):
                return False
        elif key == "not":
            if accepts(limit, value):
                return False
        elif key in ("anyOf", "oneOf", "allOf"):
            if not isinstance(limit, list):
                raise CannotMerge(f"{key} is not a list")
            matched = sum(accepts(branch, value) for branch in limit)
            if not {"anyOf": matched > 0, "oneOf": matched == 1, "allOf": matched == len(limit)}[key]:
                return False
        elif key in ("minLength", "maxLength", "pattern") and kind != "string":
            continue
        elif key in ("minLength", "maxLength"):
            n = len(value)
            if (key == "minLength" and n < limit) or (key == "maxLength" and n > limit):
                return False
        elif key == "pattern":
            try:
                if not isinstance(limit, str) or re.search(limit, value) is None:
                    return False
            except re.error:
                raise CannotMerge(f"pattern {limit!r} is not a Python regex") from None
        elif key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if kind not in ("integer", "number"):
                continue
            if isinstance(limit, bool) or not isinstance(limit, (int, float)):
                raise CannotMerge(f"non-numeric {key}")
            if ((key == "minimum" and value < limit) or (key == "maximum" and value > limit)
                    or (key == "exclusiveMinimum" and value <= limit) or (key == "exclusiveMaximum" and value >= limit)):
                return False
        elif key in ("properties", "additionalProperties", "required", "items", "minItems", "maxItems",
                     "minProperties", "maxProperties", "patternProperties", "uniqueItems"):
            if kind in ("object", "array"):
                raise CannotMerge(f"{key} on a fixed {kind} value")
        else:
            raise CannotMerge(f"{key} beside an enum")
    return True


def json_equal(x: Any, y: Any) -> bool:
    """JSON equality: 1 == 1.0, but true != 1."""
    if isinstance(x, bool) or isinstance(y, bool):
        return type(x) is type(y) and x == y
    if isinstance(x, (int, float)) and isinstance(y, (int, float)):
        return x == y
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(json_equal(p, q) for p, q in zip(x, y))
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(json_equal(x[k], y[k]) for k in x)
    return type(x) is type(y) and x == y


def _check_bounds(schema: dict) -> None:
    """An empty range in a single-type schema is an empty intersection, not a schema xgrammar errs on."""
    types = declared_types(schema)
    for low, high, kind in (("minLength", "maxLength", "string"), ("minItems", "maxItems", "array"),
                            ("minProperties", "maxProperties", "object"), ("minimum", "maximum", "integer")):
        if low in schema and high in schema and schema[low] > schema[high]:
            if types is not None and types <= ({kind, "number"} if kind == "integer" else {kind}):
                raise EmptyIntersection(f"{low} {schema[low]} is above {high} {schema[high]}")
