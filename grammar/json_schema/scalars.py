"""Rewrite rules for string and number keywords: unknown formats, lengths beside a pattern,
whole-number multiples, integer bounds beyond 64 bits."""
from __future__ import annotations

from typing import Any

from grammar.json_schema.one_of import instance_types
from grammar.json_schema.rule import RuleContext
from grammar.regex.length_pattern import fold_lengths

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def unknown_format(node: dict, pointer: str, context: RuleContext) -> Any:
    """A format name the backend does not enforce (context.enforced_formats) is dropped: in 2020-12
    format is an annotation (exact by the spec); the caller lists it as a note."""
    fmt = node.get("format")
    if fmt is None or fmt in context.enforced_formats:
        return node
    context.note(f"format {fmt!r} at {pointer or '/ (the root)'} is an annotation, not checked")
    context.fired("unknown-format", pointer)
    return {k: v for k, v in node.items() if k != "format"}


def length_pattern(node: dict, pointer: str, context: RuleContext) -> Any:
    """minLength/maxLength folded into a simple pattern (see grammar.regex.length_pattern)."""
    pattern = node.get("pattern")
    low, high = node.get("minLength", 0), node.get("maxLength")
    if not isinstance(pattern, str) or ("minLength" not in node and "maxLength" not in node):
        return node
    if not isinstance(low, int) or isinstance(low, bool) or not (high is None or isinstance(high, int)):
        return node
    folded = fold_lengths(pattern, low, high)
    if folded is None or (folded[1] and not context.monotone):
        return node
    context.fired("length-pattern", pointer, narrowing=folded[1])
    rest = {k: v for k, v in node.items() if k not in ("minLength", "maxLength")}
    return {**rest, "pattern": folded[0]}


def integral_multiple(node: dict, pointer: str, context: RuleContext) -> Any:
    """A number that is a multiple of a whole number is an integer (exact by JSON Schema,
    where 5.0 is an integer): {"type": "number", "multipleOf": 1.0} -> integer, multipleOf 1."""
    value = node.get("multipleOf")
    if node.get("type") != "number" or isinstance(value, bool) or not isinstance(value, (int, float)):
        return node
    if not (float(value).is_integer() and value > 0):
        return node
    context.fired("integral-multiple", pointer)
    return {**node, "type": "integer", "multipleOf": int(value)}


def int64_bounds(node: dict, pointer: str, context: RuleContext) -> Any:
    """Integer bounds beyond 64 bits clamped to the int64 range (narrowing)."""
    if not context.monotone or instance_types(node) != {"integer"}:
        return node
    out = dict(node)
    for key, clamp in (("minimum", max), ("exclusiveMinimum", max), ("maximum", min), ("exclusiveMaximum", min)):
        value = node.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
            out[key] = clamp(int(value), INT64_MIN) if clamp is max else clamp(int(value), INT64_MAX)
    if out == node:
        return node
    if (isinstance(node.get("minimum"), (int, float)) and node["minimum"] > INT64_MAX) or \
            (isinstance(node.get("maximum"), (int, float)) and node["maximum"] < INT64_MIN):
        return node  # the range lies outside int64: left for xgrammar to refuse
    context.fired("int64-bounds", pointer, narrowing=True)
    return out
