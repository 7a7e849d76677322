"""Rewrite rule for `uniqueItems` where it says nothing or can be written out: xgrammar never
enforces it, but an array of at most one item is always unique, and the duplicate-free arrays
of a few fixed values can be listed. Any other uniqueItems stays for the checker to refuse."""
from __future__ import annotations

import itertools
from typing import Any

from grammar.json_schema.merge import CannotMerge, json_equal, json_type
from grammar.json_schema.rule import RuleContext, asserting

MAX_UNIQUE_ARRAYS = 100  # duplicate-free arrays listed as an enum at most
_ARRAY_KEYWORDS = {"type", "items", "minItems", "maxItems", "uniqueItems"}


def unique_items(node: dict, pointer: str, context: RuleContext) -> Any:
    """uniqueItems dropped where it holds anyway (false, maxItems <= 1, or items of one value
    with maxItems 1 added), or written as the enum of every duplicate-free array of an items
    enum (exact in each case)."""
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
    values = _fixed_values(items)
    if values is None:
        return node
    arrays = _unique_arrays(values, low, len(values) if high is None else min(high, len(values)))
    if arrays is None:
        return node
    context.fired("uniqueItems", pointer)
    if not arrays:
        return False  # more distinct items required than there are values
    return {k: v for k, v in node.items() if k not in _ARRAY_KEYWORDS} | {"enum": arrays}


def _fixed_values(items: Any) -> list | None:
    """The distinct values an items schema of only enum/const allows (None: anything else)."""
    if not isinstance(items, dict) or set(asserting(items)) - {"enum", "const", "type"}:
        return None
    if "enum" in items and isinstance(items["enum"], list):
        values = items["enum"]
    elif "const" in items:
        values = [items["const"]]
    else:
        return None
    if "type" in items:
        declared = items["type"] if isinstance(items["type"], list) else [items["type"]]
        values = [v for v in values if json_type(v) in declared or (json_type(v) == "integer" and "number" in declared)]
    distinct: list = []
    for value in values:
        if not any(json_equal(value, seen) for seen in distinct):
            distinct.append(value)
    return distinct


def _unique_arrays(values: list, low: int, high: int) -> list | None:
    """Every ordered selection of low..high distinct values, or None past MAX_UNIQUE_ARRAYS."""
    out: list = []
    for length in range(max(low, 0), high + 1):
        for selection in itertools.permutations(values, length):
            out.append(list(selection))
            if len(out) > MAX_UNIQUE_ARRAYS:
                return None
    return out
