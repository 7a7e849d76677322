"""Rewrite rules that write a conjunction as one schema: `allOf`, keywords beside `$ref`, beside
`anyOf`/`oneOf` (distributed into the branches) and beside `enum`/`const`. All exact: each is
grammar.json_schema.merge.merge applied where xgrammar would read only one side."""
from __future__ import annotations

import hashlib
import json
from typing import Any

from grammar.backend import GrammarError
from grammar.json_schema.merge import CannotMerge, EmptyIntersection, copy_json, merge
from grammar.json_schema.rule import RuleContext, asserting, kept
from grammar.json_schema.walk import resolve_pointer


def ref_siblings(node: dict, pointer: str, context: RuleContext) -> Any:
    """Keywords beside $ref merged with its target (exact). A target that refers to itself with
    the same keywords beside the reference (or the root, "#") becomes a definition of its own
    (recursive_ref_siblings)."""
    if "$ref" not in node or not asserting(node, "$ref"):
        return node
    try:
        target = context.resolved({"$ref": node["$ref"]})
        merged = merge(asserting(node, "$ref"), target)
    except CannotMerge:
        return recursive_ref_siblings(node, pointer, context)
    context.fired("ref-siblings", pointer)
    return {**kept(node, "$ref"), **merged}


def recursive_ref_siblings(node: dict, pointer: str, context: RuleContext) -> Any:
    """{"$ref": R, S...} where R's target T refers back to R with the same keywords S beside it:
    a new definition D = S merged with T, in which each such {"$ref": R, S...} refers to D
    instead; the node becomes {"$ref": D}. Exact: D is what the node means (S and T), and each
    inner reference means it too (the instance nesting is finite, so the recursion ends). Only
    local references; the definition goes in the root's $defs, named by a hash of R and S."""
    ref, siblings = node["$ref"], asserting(node, "$ref")
    root = context.root
    if not isinstance(ref, str) or not isinstance(root, dict) or not isinstance(root.get("$defs", {}), dict):
        return node
    if ref == "#":
        target = {k: v for k, v in root.items() if k not in ("$defs", "definitions", "$schema", "$id", "id")}
    elif ref.startswith("#/"):
        target = resolve_pointer(root, ref)
    else:
        return node
    digest = hashlib.sha256(json.dumps([ref, siblings], sort_keys=True).encode()).hexdigest()[:12]
    name = f"formwork-ref-{digest}"
    replacement = {**kept(node, "$ref"), "$ref": f"#/$defs/{name}"}
    if name in root.get("$defs", {}) or name in context.new_defs:
        context.fired("ref-siblings-recursive", pointer)
        return replacement
    if target is None:
        return node
    body = _with_ref_replaced(copy_json(target), ref, siblings, f"#/$defs/{name}")
    try:
        merged = merge(siblings, body)
    except CannotMerge:
        return node
    context.new_defs[name] = merged
    context.fired("ref-siblings-recursive", pointer)
    return replacement


def _with_ref_replaced(value: Any, ref: str, siblings: dict, new_ref: str) -> Any:
    """`value` with every {"$ref": ref} carrying exactly `siblings` pointed at `new_ref` instead."""
    if isinstance(value, list):
        return [_with_ref_replaced(v, ref, siblings, new_ref) for v in value]
    if not isinstance(value, dict):
        return value
    if value.get("$ref") == ref and asserting(value, "$ref") == siblings:
        return {**kept(value, "$ref"), "$ref": new_ref}
    return {k: _with_ref_replaced(v, ref, siblings, new_ref) for k, v in value.items()}


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
