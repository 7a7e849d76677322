"""When a oneOf is an anyOf: proofs that its branches are pairwise disjoint, the rewrite of a
oneOf whose branches differ only in `required` into exclusive alternatives, and the rewrite rule
that applies both.

xgrammar enforces a oneOf as an anyOf (and warns) unless it can tell the branches apart itself;
every proof here is a sufficient condition, never a guess. Pure JSON -> JSON.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from grammar.json_schema.merge import CannotMerge, copy_json, declared_types, json_equal, json_type
from grammar.json_schema.rule import RuleContext

MAX_ALTERNATIVES = 16
_MAX_DEPTH = 16  # property levels a disjointness proof descends


def instance_types(node: Any) -> set[str] | None:
    """The instance types a node admits: declared, or those of its enum/const values; None: any."""
    if not isinstance(node, dict):
        return None if node is True else set()
    try:
        declared = declared_types(node)
    except CannotMerge:
        return None
    if "enum" in node or "const" in node:
        values = node["enum"] if isinstance(node.get("enum"), list) else [node.get("const")]
        kinds = {json_type(v) for v in values}
        return kinds if declared is None else {k for k in kinds if k in declared}
    if declared is not None and declared >= {"integer", "number"}:
        declared = declared - {"integer"} | {"number"}
    return declared


def _values(node: Any) -> list | None:
    if isinstance(node, dict) and isinstance(node.get("enum"), list):
        return node["enum"]
    if isinstance(node, dict) and "const" in node:
        return [node["const"]]
    return None


def _same(node: Any) -> Any:
    return node


def disjoint(x: Any, y: Any, resolve: Callable[[Any], Any] = _same, depth: int = 0) -> bool:
    """Whether no instance can be valid against both (a sufficient test, never a guess).
    `resolve` turns a bare local $ref into its target (CannotMerge where it cannot)."""
    if depth > _MAX_DEPTH:
        return False  # e.g. two recursive definitions compared property by property
    x, y = _resolved(x, resolve), _resolved(y, resolve)
    tx, ty = _branch_types(x, resolve), _branch_types(y, resolve)
    if tx is not None and ty is not None:
        wide = lambda t: t | ({"integer"} if "number" in t else set())  # noqa: E731
        if not wide(tx) & wide(ty):
            return True
    vx, vy = _values(x), _values(y)
    if vx is not None and vy is not None:
        return not any(json_equal(a, b) for a in vx for b in vy)
    if not (isinstance(x, dict) and isinstance(y, dict)):
        return False
    return _disjoint_objects(x, y, resolve, depth) or _disjoint_objects(y, x, resolve, depth)


def _resolved(node: Any, resolve: Callable[[Any], Any]) -> Any:
    try:
        return resolve(node)
    except CannotMerge:
        return node


def _branch_types(node: Any, resolve: Callable[[Any], Any], depth: int = 0) -> set[str] | None:
    """instance_types, and for an untyped anyOf/oneOf the union of its branches' types."""
    types = instance_types(node)
    if types is not None or not isinstance(node, dict) or "type" in node or depth > _MAX_DEPTH:
        return types
    key = "anyOf" if isinstance(node.get("anyOf"), list) else "oneOf" if isinstance(node.get("oneOf"), list) else None
    if key is None or not node[key]:
        return None
    out: set[str] = set()
    for branch in node[key]:
        inner = _branch_types(_resolved(branch, resolve), resolve, depth + 1)
        if inner is None:
            return None
        out |= inner
    return out


def _disjoint_objects(x: dict, y: dict, resolve: Callable[[Any], Any], depth: int) -> bool:
    """x requires a name y cannot have (closed without it), or a name whose value x and y's
    schema for it (declared, else additionalProperties) cannot share."""
    x_required = x.get("required") if isinstance(x.get("required"), list) else []
    x_props = x.get("properties") if isinstance(x.get("properties"), dict) else {}
    y_props = y.get("properties") if isinstance(y.get("properties"), dict) else {}
    y_closed = y.get("additionalProperties") is False and "patternProperties" not in y
    if instance_types(x) != {"object"} and instance_types(y) != {"object"}:
        return False  # both untyped: a non-object instance satisfies both
    for name in x_required:
        if y_closed and name not in y_props:
            return True
        # the name is present (x requires it), so y checks its value against its own schema for it
        if name not in y_props and "patternProperties" in y:
            continue  # a pattern may be what applies to it in y
        y_value = y_props.get(name, y.get("additionalProperties", True))
        if name in x_props and disjoint(x_props[name], y_value, resolve, depth + 1):
            return True
    return False


def one_of_by_required(branches: list) -> tuple[list, bool] | None:
    """oneOf of branches that differ only in `required` (the usual "give radius, or length and
    width" object), as an anyOf: branch i requires its names and lacks, for every other branch j,
    one of the names j requires beyond i's. A lacking name is removed from properties of a
    closed object; closing an open one narrows. (alternatives, narrowed), or None past
    MAX_ALTERNATIVES or for any other shape."""
    if not all(isinstance(b, dict) and isinstance(b.get("required"), list) for b in branches):
        return None
    common = [{k: v for k, v in b.items() if k != "required"} for b in branches]
    if any(c != common[0] for c in common) or instance_types(common[0]) != {"object"}:
        return None
    base = common[0]
    if not isinstance(base.get("properties", {}), dict) or "patternProperties" in base:
        return None
    required = [list(dict.fromkeys(b["required"])) for b in branches]
    alternatives: list = []
    for i, names in enumerate(required):
        extra = [[n for n in other if n not in names] for j, other in enumerate(required) if j != i]
        if any(not e for e in extra):
            continue  # whatever satisfies branch i satisfies another too
        seen = set()
        for combination in itertools.product(*extra):
            absent = frozenset(combination)
            if absent in seen:
                continue
            seen.add(absent)
            branch = copy_json(base)
            branch["properties"] = {n: s for n, s in base.get("properties", {}).items() if n not in absent}
            branch["additionalProperties"] = False
            branch["required"] = names
            alternatives.append(branch)
            if len(alternatives) > MAX_ALTERNATIVES:
                return None
    if not alternatives:
        return None
    return alternatives, base.get("additionalProperties") is not False


def exclusive_one_of(node: dict, pointer: str, context: RuleContext) -> Any:
    """A oneOf whose branches are proven pairwise disjoint is an anyOf (exact). Else, where
    narrowing is allowed: if closing its open object branches makes each disjoint from every
    other branch as written, the anyOf of the closed branches (each instance of one is valid
    against it alone: narrowing)."""
    branches = node.get("oneOf")
    if not isinstance(branches, list) or len(branches) < 2 or "anyOf" in node:
        return node
    try:
        resolved = [context.resolved(b) for b in branches]
    except CannotMerge:
        return node
    rest = {k: v for k, v in node.items() if k != "oneOf"}
    if all(disjoint(x, y, context.resolved) for x, y in itertools.combinations(resolved, 2)):
        context.fired("oneOf-exclusive", pointer)
        return {**rest, "anyOf": branches}
    by_required = one_of_by_required(resolved)
    if by_required is not None and not (by_required[1] and not context.monotone):
        context.fired("oneOf-required", pointer, narrowing=by_required[1])
        return {**rest, "anyOf": by_required[0]}
    closed = [_closed(b) for b in resolved]
    if not context.monotone or closed == resolved:
        return node
    if all(disjoint(closed[i], resolved[j], context.resolved)
           for i, j in itertools.permutations(range(len(resolved)), 2)):
        context.fired("oneOf-closed", pointer, narrowing=True)
        return {**rest, "anyOf": closed}
    return node


def one_of_by_discriminator(branches: list) -> list | None:
    """Object branches told apart by a property every one declares with an enum or const, no
    value shared by two branches (a tagged union: "kind": "circle" / "square"), with that
    property required in each: an instance that has it matches one branch at most, so the
    branches are disjoint. Instances without it are what is dropped (a narrowing, unless every
    branch required it already: then the disjointness proof has fired first). None: no such
    property, or the branches are not all objects."""
    if not all(isinstance(b, dict) and instance_types(b) == {"object"} and isinstance(b.get("properties"), dict)
               for b in branches):
        return None
    for name in branches[0]["properties"]:
        value_sets = [_values(b["properties"].get(name)) for b in branches]
        if any(values is None for values in value_sets):
            continue
        if any(json_equal(a, b) for x, y in itertools.combinations(value_sets, 2) for a in x for b in y):
            continue
        out = []
        for branch in branches:
            required = branch.get("required") if isinstance(branch.get("required"), list) else []
            out.append({**branch, "required": [*required, name] if name not in required else required})
        return out
    return None


def discriminated_one_of(node: dict, pointer: str, context: RuleContext) -> Any:
    """Where narrowing is allowed, a oneOf still left (no exact rule applied) whose object
    branches have a discriminating property (one_of_by_discriminator), or a property they all
    declare that, required, makes them disjoint (_by_required_property): the anyOf of the
    branches with it required (narrowing)."""
    branches = node.get("oneOf")
    if not context.monotone or not isinstance(branches, list) or len(branches) < 2 or "anyOf" in node:
        return node
    try:
        resolved = [context.resolved(b) for b in branches]
    except CannotMerge:
        return node
    alternatives = one_of_by_discriminator(resolved)
    if alternatives is None or not _pairwise_disjoint(alternatives, context):
        alternatives = _by_required_property(resolved, context)
    if alternatives is None:
        return node
    context.fired("oneOf-discriminator", pointer, narrowing=True)
    return {**{k: v for k, v in node.items() if k != "oneOf"}, "anyOf": alternatives}


def _pairwise_disjoint(branches: list, context: RuleContext) -> bool:
    return all(disjoint(x, y, context.resolved) for x, y in itertools.combinations(branches, 2))


def _by_required_property(branches: list, context: RuleContext) -> list | None:
    """The object branches with one property they all declare made required, the first such
    property that makes them pairwise disjoint (a tag nested deeper: "_attributes" whose
    schema requires a "repository_system" of an enum of its own in each branch). None: none does."""
    if not all(isinstance(b, dict) and instance_types(b) == {"object"} and isinstance(b.get("properties"), dict)
               for b in branches):
        return None
    for name in branches[0]["properties"]:
        if not all(name in b["properties"] for b in branches):
            continue
        out = []
        for branch in branches:
            required = branch.get("required") if isinstance(branch.get("required"), list) else []
            out.append({**branch, "required": [*required, name] if name not in required else required})
        if _pairwise_disjoint(out, context):
            return out
    return None


def _closed(branch: Any) -> Any:
    """An open object branch with additionalProperties false (strict mode's reading anyway)."""
    if (isinstance(branch, dict) and instance_types(branch) == {"object"} and "patternProperties" not in branch
            and branch.get("additionalProperties", True) is True and "$ref" not in branch):
        return {**branch, "additionalProperties": False}
    return branch
