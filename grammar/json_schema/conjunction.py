"""Rewrite rules that write a conjunction as one schema: `allOf`, keywords beside `$ref`, beside
`anyOf`/`oneOf` (distributed into the branches) and beside `enum`/`const`. All exact: each is
grammar.json_schema.merge.merge applied where xgrammar would read only one side."""
from __future__ import annotations

from typing import Any

from grammar.backend import GrammarError
from grammar.json_schema.merge import CannotMerge, EmptyIntersection, merge
from grammar.json_schema.rule import RuleContext, asserting, kept


def ref_siblings(node: dict, pointer: str, context: RuleContext) -> Any:
    """Keywords beside $ref merged with its target (exact). A recursive reference is left alone."""
    if "$ref" not in node or not asserting(node, "$ref"):
        return node
    try:
        target = context.resolved({"$ref": node["$ref"]})
        merged = merge(asserting(node, "$ref"), target)
    except CannotMerge:
        return node
    context.fired("ref-siblings", pointer)
    return {**kept(node, "$ref"), **merged}


def all_of(node: dict, pointer: str, context: RuleContext) -> Any:
    """allOf folded into one schema with its siblings (exact); an empty intersection is an error."""
    branches = node.get("allOf")
    if not isinstance(branches, list) or not branches:
        return node
    merged: Any = asserting(node, "allOf")
    try:
        for branch in branches:
            merged = merge(merged, context.resolved(branch))
    except EmptyIntersection as e:
        raise GrammarError(f"allOf at {pointer or '/ (the root)'} allows no value: {e}") from None
    except CannotMerge:
        return node
    context.fired("allOf", pointer)
    return {**kept(node, "allOf"), **merged} if isinstance(merged, dict) else merged


def distribute(node: dict, pointer: str, context: RuleContext) -> Any:
    """Keywords beside anyOf/oneOf merged into every branch (exact: S and exactly-one(Bi) is
    exactly-one(S and Bi)); branches that are or become empty are dropped (exact), and so is a
    node with none left (it becomes false); one branch left is inlined."""
    key = "anyOf" if "anyOf" in node else "oneOf" if "oneOf" in node else None
    if key is None or not isinstance(node[key], list) or ("anyOf" in node and "oneOf" in node):
        return node
    siblings = asserting(node, key)
    branches = []
    try:
        for branch in node[key]:
            try:
                branches.append(merge(siblings, context.resolved(branch)) if siblings else branch)
            except EmptyIntersection:
                continue
    except CannotMerge:
        return _without_vacuous(node, pointer, context)
    branches = [b for b in branches if b is not False]
    if not branches:
        context.fired(f"{key}-siblings", pointer)
        return False  # no branch admits anything: neither does the node
    if not siblings and len(branches) > 1 and branches == node[key]:
        return node
    context.fired(f"{key}-siblings", pointer)
    rest = kept(node, key)
    if len(branches) == 1:
        return {**rest, **branches[0]} if isinstance(branches[0], dict) else branches[0]
    return {**rest, key: branches}


def _without_vacuous(node: dict, pointer: str, context: RuleContext) -> dict:
    """`node` without the siblings that assert nothing (`additionalProperties` / `items` of true
    or {}, what their absence means): where the others cannot be merged into the branches, the
    checker then sees only those that matter (exact)."""
    vacuous = [k for k in ("additionalProperties", "items") if k in node and node[k] in (True, {})]
    if not vacuous:
        return node
    context.fired("vacuous-siblings", pointer)
    return {k: v for k, v in node.items() if k not in vacuous}


def fixed_siblings(node: dict, pointer: str, context: RuleContext) -> Any:
    """Keywords beside enum/const: keep only the values they accept (exact); when they accept
    none, the node allows nothing and becomes false (exact: e.g. string values beside
    `"type": "object"`)."""
    if not ("enum" in node or "const" in node) or not asserting(node, "enum", "const"):
        return node
    fixed = {k: node[k] for k in ("enum", "const") if k in node}
    try:
        merged = merge(fixed, asserting(node, "enum", "const"))
    except EmptyIntersection:
        context.fired("enum-siblings", pointer)
        return False
    except CannotMerge:
        return node
    context.fired("enum-siblings", pointer)
    return {**kept(node), **merged}
