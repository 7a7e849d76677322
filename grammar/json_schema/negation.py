"""Rewrite rules for what may not be: `not` (a negation xgrammar ignores, turned into the
complement it means where that is a union of a few schemas xgrammar reads), a `oneOf` whose
branches may overlap (each branch and the complements of the others), and properties whose
schema is false (which xgrammar refuses to compile).

A negated schema asserts the conjunction of its keywords, so its complement is the union of
each keyword's complement: `not {"type": "array", "maxItems": 0}` is "not an array, or an array
of at least one item" (a typed keyword holds for every other type, so its complement has only
its own type: `not {"maxItems": 0}` is just the second part). Each keyword's complement is
exact; the union is intersected with the node's other keywords (grammar.json_schema.merge) and
written as one schema or an anyOf. "The name is absent" (the complement of `required`) is exact
on a closed object; an open one is closed for it (strict mode's reading anyway), which narrows,
so only where narrowing is allowed.
"""
from __future__ import annotations

import itertools
import json
import math
import re
from typing import Any

from grammar.json_schema.one_of import MAX_ALTERNATIVES, instance_types
from grammar.json_schema.merge import (TYPES, CannotMerge, EmptyIntersection, declared_types, json_equal, json_type,
                                       merge, type_value)
from grammar.json_schema.rule import RuleContext, asserting, kept

# an alternative of a complement: (a schema, names the instance must not have)
_Alternative = tuple[Any, frozenset]
# bound keyword -> (its type, the complementary keyword, the offset from the value)
_COUNT_COMPLEMENTS = {
    "maxItems": ("array", "minItems", 1), "minItems": ("array", "maxItems", -1),
    "maxLength": ("string", "minLength", 1), "minLength": ("string", "maxLength", -1),
    "maxProperties": ("object", "minProperties", 1), "minProperties": ("object", "maxProperties", -1),
}
# an unanchored pattern of one character class: "contains a character of the class"
_ONE_CLASS = re.compile(r"\[(\^?)((?:[^\]\\\[]|\\.)+)\]")


def not_rule(node: dict, pointer: str, context: RuleContext) -> Any:
    """not of a schema replaced by its complement intersected with the node's other keywords
    (exact, but for closing an open object to keep a name out: narrowing)."""
    if "not" not in node:
        return node
    rest = {k: v for k, v in node.items() if k != "not"}
    try:
        alternatives = _Complement(context, rest).of(node["not"])
    except CannotMerge:
        return node
    if alternatives is None:
        return node
    branches, narrowed = [], False
    base = asserting(rest)
    for schema, absent in alternatives:
        try:
            branch = merge(base, schema)
            if absent:
                branch, closed = without_names(branch, absent, context.monotone)
                narrowed |= closed
        except EmptyIntersection:
            continue
        except CannotMerge:
            return node
        if branch not in branches:
            branches.append(branch)
    context.fired("not", pointer, narrowing=narrowed)
    if not branches:
        return False
    if len(branches) == 1:
        return {**kept(node, "not"), **branches[0]} if isinstance(branches[0], dict) else branches[0]
    return {**kept(node, "not"), "anyOf": branches}


def one_of_by_negation(node: dict, pointer: str, context: RuleContext) -> Any:
    """A oneOf no proof made exclusive, as what it means: anyOf over "this branch and not the
    others", where not_rule writes every complement out, nested ones too (exact; not_rule closes
    an open object where narrowing is allowed, and says so)."""
    branches = node.get("oneOf")
    if not isinstance(branches, list) or not 2 <= len(branches) <= MAX_ONE_OF_BRANCHES or "anyOf" in node:
        return node
    try:
        resolved = [context.resolved(b) for b in branches]
    except CannotMerge:
        return node
    scratch = RuleContext(root=context.root, monotone=context.monotone)  # reported only if it applies
    alternatives = []
    for i, own in enumerate(resolved):
        branch: Any = own
        for j, other in enumerate(resolved):
            if j != i and branch is not False:
                branch = _and_not(branch, other, pointer, scratch)
                if branch is None:
                    return node
        if branch is not False and branch not in alternatives:
            alternatives.append(branch)
    if len(json.dumps(alternatives)) > MAX_ONE_OF_GROWTH * len(json.dumps(resolved)):
        return node  # the complements would outweigh the branches: left as it was
    context.rules.update(scratch.rules)
    context.narrowed += scratch.narrowed
    context.fired("oneOf-negation", pointer)
    rest = {k: v for k, v in node.items() if k != "oneOf"}
    if not alternatives:
        return False
    return {**rest, "anyOf": alternatives}


MAX_ONE_OF_BRANCHES = 3  # a oneOf of more is left alone: each branch carries every other's complement
MAX_ONE_OF_GROWTH = 4  # the written-out branches may be this many times the size of the branches


def _and_not(schema: Any, negated: Any, pointer: str, context: RuleContext) -> Any:
    """`schema` and not `negated` as a schema without `not` (False: nothing), or None."""
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        return None
    try:  # a branch's own not and this one: not of their anyOf
        combined = merge(schema, {"not": negated}) if "not" in schema else {**schema, "not": negated}
    except CannotMerge:
        return None
    out = not_rule(combined, pointer, context) if isinstance(combined, dict) else combined
    return _without_nots(out, pointer, context)


def _without_nots(schema: Any, pointer: str, context: RuleContext, depth: int = 0) -> Any:
    """`schema` with the `not`s the complements left inside (under properties and anyOf) written
    out, or None where one cannot be."""
    if not isinstance(schema, dict) or depth > 8:
        return schema if not isinstance(schema, dict) else None
    out = dict(schema)
    if isinstance(out.get("properties"), dict):
        properties = {}
        for name, sub in out["properties"].items():
            properties[name] = _without_nots(sub, pointer, context, depth + 1)
            if properties[name] is None:
                return None
        out["properties"] = properties
    if isinstance(out.get("anyOf"), list):
        branches = [_without_nots(b, pointer, context, depth + 1) for b in out["anyOf"]]
        if any(b is None for b in branches):
            return None
        out["anyOf"] = branches
    if "not" in out:
        out = not_rule(out, pointer, context)
        if isinstance(out, dict) and "not" in out:
            return None
        return _without_nots(out, pointer, context, depth + 1)  # the complement's own nested nots
    return out


def false_properties(node: dict, pointer: str, context: RuleContext) -> Any:
    """A property whose schema is false (directly or by reference) may not appear: removed from
    properties (exact on a closed object; an open one is closed for it, narrowing), and an object
    that requires it allows nothing. xgrammar refuses a false subschema."""
    properties = node.get("properties")
    if not isinstance(properties, dict):
        return node
    try:
        names = frozenset(n for n, s in properties.items() if context.resolved(s) is False)
    except CannotMerge:
        return node
    if not names:
        return node
    try:
        out, closed = without_names(node, names, context.monotone)
    except EmptyIntersection:
        context.fired("false-property", pointer)
        return False
    except CannotMerge:
        return node
    context.fired("false-property", pointer, narrowing=closed)
    return out


def false_patterns(node: dict, pointer: str, context: RuleContext) -> Any:
    """patternProperties whose schemas are all false: no name they match may appear. Removed,
    with the object closed (exact on a closed object; an open one lets its other names through
    additionalProperties, so closing it narrows), and declared properties it matches made false
    (the false_properties rule then removes them). xgrammar refuses a false subschema."""
    patterns = node.get("patternProperties")
    if not isinstance(patterns, dict) or instance_types(node) != {"object"}:
        return node
    try:
        dead = [p for p, s in patterns.items() if context.resolved(s) is False]
        properties = node.get("properties", {})
        matched = {n for n in properties for p in dead if re.search(p, n)} if isinstance(properties, dict) else set()
    except (CannotMerge, re.error):
        return node
    closed = node.get("additionalProperties") is False
    if not dead or len(dead) < len(patterns) or not isinstance(properties, dict) or \
            (not closed and not context.monotone):
        return node  # beside another pattern, a name both match would get through the other
    out = {k: v for k, v in node.items() if k != "patternProperties"}
    out["additionalProperties"] = False
    if matched:
        out["properties"] = {n: False if n in matched else s for n, s in properties.items()}
    context.fired("false-pattern", pointer, narrowing=not closed)
    return out


def without_names(schema: Any, names: frozenset, may_close: bool) -> tuple[Any, bool]:
    """`schema` with `names` not allowed to appear, and whether an open object was closed for it;
    EmptyIntersection if one of them is required, CannotMerge where that cannot be written."""
    if not isinstance(schema, dict) or instance_types(schema) != {"object"} or "patternProperties" in schema:
        raise CannotMerge("names kept out of a schema that is not a plain object")
    if names & set(schema.get("required", [])):
        raise EmptyIntersection("a name both required and absent")
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        raise CannotMerge("unreadable properties")
    closed = schema.get("additionalProperties") is False
    if not closed and not may_close:
        raise CannotMerge("keeping a name out of an open object narrows it")
    out = {**schema, "properties": {n: s for n, s in properties.items() if n not in names},
           "additionalProperties": False}
    return out, not closed


def _other_types(types: set[str]) -> set[str]:
    """Every instance type outside `types` (integer spelled out)."""
    return set(TYPES) - types - ({"integer"} if "number" in types else set())


class _Complement:
    """The complement of a negated schema as alternatives (None: not written here), within `rest`."""

    def __init__(self, context: RuleContext, rest: dict) -> None:
        self.context = context
        self.rest = rest
        self.rest_types = instance_types(rest)

    def of(self, negated: Any) -> list[_Alternative] | None:
        negated = self.context.resolved(negated)
        if negated is False:
            return [({}, frozenset())]
        if negated is True:
            return []
        if not isinstance(negated, dict) or "$ref" in negated:
            return None
        out: list[_Alternative] = []
        for key, value in asserting(negated).items():
            part = self.keyword(key, value, negated)
            if part is None:
                return None
            out += part
            if len(out) > MAX_ALTERNATIVES:
                return None
        return out

    def keyword(self, key: str, value: Any, negated: dict) -> list[_Alternative] | None:
        """The complement of the keyword {key: value} of `negated` (its other keywords matter only
        to additionalProperties)."""
        if key == "type":
            return self.types(value)
        if key == "anyOf" and isinstance(value, list):
            return self.any_of(value)
        if key == "allOf" and isinstance(value, list):
            parts = [self.of(branch) for branch in value]
            return None if any(p is None for p in parts) else [a for p in parts for a in p]  # type: ignore[union-attr]
        if key == "not":
            return [(self.context.resolved(value), frozenset())]
        if self.rest_types is None:
            return None  # the other complements are written within the node's declared types
        if key in ("enum", "const"):
            return self.values(value if key == "enum" else [value])
        if key in _COUNT_COMPLEMENTS:
            if isinstance(value, bool) or not isinstance(value, int):
                return None
            family, other, offset = _COUNT_COMPLEMENTS[key]
            return [({"type": family, other: value + offset}, frozenset())] if value + offset >= 0 else []
        if key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            return self.integer_bound(key, value)
        if key == "required" and isinstance(value, list) and all(isinstance(n, str) for n in value):
            return [({"type": "object"}, frozenset([name])) for name in value]
        if key == "properties" and isinstance(value, dict):
            out: list[_Alternative] = []
            for name, schema in value.items():
                if self.own_property(name) is False or json_equal(self.own_property(name), schema):
                    continue  # the node's own schema for the name rejects the value this would need
                if schema is not True and schema != {}:
                    inner = {} if schema is False else {"not": schema}
                    out.append(({"type": "object", "required": [name], "properties": {name: inner}}, frozenset()))
            return out
        if key == "pattern" and isinstance(value, str):
            return self.pattern(value)
        if key == "additionalProperties" and value is False:
            return self.extra_names(negated)
        return None

    def own_property(self, name: str) -> Any:
        """The node's schema for property `name` (declared, else additionalProperties), or None
        where patternProperties may decide it."""
        properties = self.rest.get("properties", {})
        if isinstance(properties, dict) and name in properties:
            return properties[name]
        if "patternProperties" in self.rest:
            return None
        return self.rest.get("additionalProperties", True)

    def extra_names(self, negated: dict) -> list[_Alternative] | None:
        """not "no names beyond properties": a name beyond them is present. Written only within a
        closed node, whose own names are the only ones an instance can have."""
        own, theirs = self.rest.get("properties", {}), negated.get("properties", {})
        if self.rest.get("additionalProperties") is not False or "patternProperties" in self.rest or \
                "patternProperties" in negated or not isinstance(own, dict) or not isinstance(theirs, dict):
            return None
        return [({"type": "object", "required": [name]}, frozenset()) for name in own if name not in theirs]

    def types(self, value: Any) -> list[_Alternative] | None:
        others = _other_types(declared_types({"type": value}) or set())
        if "number" in others and "integer" not in others:  # "numbers but not integers": no type says that
            if self.rest_types is None or self.rest_types & {"number", "integer"}:
                return None
            others.discard("number")
        return [({"type": type_value(others)}, frozenset())] if others else []

    def any_of(self, branches: list) -> list[_Alternative] | None:
        """not (A or B) is (not A) and (not B): the product of the branches' complements."""
        parts = [self.of(branch) for branch in branches]
        if any(p is None for p in parts) or math.prod(len(p) for p in parts) > MAX_ALTERNATIVES ** 2:  # type: ignore[arg-type]
            return None
        out: list[_Alternative] = []
        for combination in itertools.product(*parts):  # type: ignore[misc]
            schema: Any = {}
            try:
                for part, _ in combination:
                    schema = merge(schema, part)
            except EmptyIntersection:
                continue
            alternative = (schema, frozenset().union(*(names for _, names in combination)))
            if alternative not in out:
                out.append(alternative)
            if len(out) > MAX_ALTERNATIVES:
                return None
        # an alternative that keeps more names out than another with the same schema adds nothing
        return [(s, a) for s, a in out if not any(s2 == s and a2 < a for s2, a2 in out)]

    def values(self, values: Any) -> list[_Alternative] | None:
        """The values of the node (its enum, or its finite type's) that are not `values`."""
        if not isinstance(values, list):
            return None
        if "enum" in self.rest or "const" in self.rest:
            own = self.rest["enum"] if "enum" in self.rest else [self.rest["const"]]
        elif self.rest_types is not None and self.rest_types <= {"boolean", "null"}:
            own = [v for v in (None, False, True) if json_type(v) in self.rest_types]
        else:
            return None
        if not isinstance(own, list):
            return None
        remaining = [v for v in own if not any(json_equal(v, x) for x in values)]
        return [({"enum": remaining}, frozenset())] if remaining else []

    def integer_bound(self, key: str, value: Any) -> list[_Alternative] | None:
        """not of a numeric bound, on an integer node only (the complement of a number bound
        would need exclusive bounds, which draft 4 writes differently)."""
        if self.rest_types != {"integer"} or isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        if not math.isfinite(value):
            return None
        bound = {"maximum": ("minimum", math.floor(value) + 1), "minimum": ("maximum", math.ceil(value) - 1),
                 "exclusiveMaximum": ("minimum", math.ceil(value)),
                 "exclusiveMinimum": ("maximum", math.floor(value))}[key]
        return [({"type": "integer", bound[0]: bound[1]}, frozenset())]

    def pattern(self, pattern: str) -> list[_Alternative] | None:
        """not "contains a character of [S]" is "every character outside it", and the reverse."""
        match = _ONE_CLASS.fullmatch(pattern)
        if match is None:
            return None
        negated, body = match.groups()
        complement = f"^[{body}]*$" if negated else f"^[^{body}]*$"
        return [({"type": "string", "pattern": complement}, frozenset())]
