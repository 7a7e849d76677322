"""Rewrite rule for `uniqueItems` where it says nothing or can be written out: neither backend
enforces it, but an array of at most one item is always unique, and the duplicate-free arrays
of items drawn from a small finite set (an enum or const, booleans, null, or an anyOf of those)
can be listed. Any other uniqueItems stays for the checker to refuse."""
from __future__ import annotations

import itertools
import json
from typing import Any

from grammar.json_schema.merge import CannotMerge, json_equal, json_type
from grammar.json_schema.rule import RuleContext, asserting

# duplicate-free arrays listed as an enum at most, and their JSON text: every selection of up to 5
# values (326 arrays) fits, and compiles in tens of ms on either backend (all 1,957 of 6 values
# took 0.2 s on xgrammar and 0.6 s on llguidance)
MAX_UNIQUE_ARRAYS = 400
MAX_UNIQUE_ARRAYS_BYTES = 32 * 1024
_FIXED_TYPES = {"boolean": [False, True], "null": [None]}  # the types that have finitely many values
_ARRAY_KEYWORDS = {"type", "items", "minItems", "maxItems", "uniqueItems"}


def unique_items(node: dict, pointer: str, context: RuleContext) -> Any:
    """uniqueItems dropped where it holds anyway (false, maxItems <= 1, or items of one value
    with maxItems 1 added), or written as the enum of every duplicate-free array of items drawn
    from a finite set (exact in each case)."""
    if "uniqueItems" not in node:
        return node
    rest = {k: v for k, v in node.items() if k != "uniqueItems"}
    if node["uniqueItems"] is False:
        context.fired("uniqueItems", pointer)
        return rest
    if node["uniqueItems"] is not True or node.get("type") != "array" or set(asserting(node)) - _ARRAY_KEYWORDS:
        return node
    low, high = node.get("minItems", 0), node.get("maxItems")
    if not isinstance(low, int) or not (high is None or isinstance(high, int)):
        return node
    if high is not None and high <= 1:
        context.fired("uniqueItems", pointer)
        return rest
    try:
        items = context.resolved(node.get("items", True))
    except CannotMerge:
        return node
    values = _fixed_values(items, context)
    if values is None:
        return node
    arrays = _unique_arrays(values, low, len(values) if high is None else min(high, len(values)))
    if arrays is None:
        return node
    context.fired("uniqueItems", pointer)
    if not arrays:
        return False  # more distinct items required than there are values
    return {k: v for k, v in node.items() if k not in _ARRAY_KEYWORDS} | {"enum": arrays}


def _fixed_values(items: Any, context: RuleContext | None = None, depth: int = 0) -> list | None:
    """The distinct values an items schema allows when they are finitely many: an enum or const
    (filtered by a type beside it), a type of boolean and/or null, or an anyOf/oneOf of such
    branches (their union: a value of two oneOf branches is valid against neither, so oneOf is
    taken only when its branches share no value). None: anything else."""
    if not isinstance(items, dict) or depth > 4:
        return None
    keywords = set(asserting(items))
    key = "anyOf" if "anyOf" in keywords else "oneOf" if "oneOf" in keywords else None
    if key is not None:
        return _union_values(items, key, keywords, context, depth)
    if keywords - {"enum", "const", "type"}:
        return None
    declared = items.get("type")
    declared = declared if isinstance(declared, list) else [declared] if isinstance(declared, str) else None
    if "enum" in items and isinstance(items["enum"], list):
        values = items["enum"]
    elif "const" in items:
        values = [items["const"]]
    elif declared is not None and all(t in _FIXED_TYPES for t in declared):
        values = [v for t in declared for v in _FIXED_TYPES[t]]
    else:
        return None
    if declared is not None:
        values = [v for v in values if json_type(v) in declared or (json_type(v) == "integer" and "number" in declared)]
    return _distinct(values)


def _union_values(items: dict, key: str, keywords: set, context: RuleContext | None, depth: int) -> list | None:
    if keywords - {key} or not isinstance(items[key], list):
        return None  # keywords beside it: the anyOf-siblings rule merges them in first
    groups = []
    for branch in items[key]:
        try:
            branch = context.resolved(branch) if context is not None else branch
        except CannotMerge:
            return None
        values = _fixed_values(branch, context, depth + 1)
        if values is None:
            return None
        groups.append(values)
    union = _distinct([v for group in groups for v in group])
    if key == "oneOf" and len(union) != sum(len(group) for group in groups):
        return None
    return union


def _distinct(values: list) -> list:
    distinct: list = []
    for value in values:
        if not any(json_equal(value, seen) for seen in distinct):
            distinct.append(value)
    return distinct


def _unique_arrays(values: list, low: int, high: int) -> list | None:
    """Every ordered selection of low..high distinct values, or None past MAX_UNIQUE_ARRAYS
    arrays or MAX_UNIQUE_ARRAYS_BYTES of their JSON text."""
    out: list = []
    num_bytes = 0
    for length in range(max(low, 0), high + 1):
        for selection in itertools.permutations(values, length):
            out.append(list(selection))
            num_bytes += len(json.dumps(out[-1]))
            if len(out) > MAX_UNIQUE_ARRAYS or num_bytes > MAX_UNIQUE_ARRAYS_BYTES:
                return None
    return out
