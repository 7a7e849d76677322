"""Rewrite rule for `not`: a negation xgrammar ignores, turned into the complement it means where
that complement is a schema xgrammar reads (a set of types, or a finite set of values). Exact."""
from __future__ import annotations

from typing import Any

from grammar.schema_merge import TYPES, CannotMerge, declared_types, json_equal, json_type, type_value
from grammar.schema_rule import RuleContext, asserting


def not_rule(node: dict, pointer: str, context: RuleContext) -> Any:
    """not of a type, or of values of a finite type, turned into its complement (exact)."""
    negated = node.get("not")
    if not isinstance(negated, dict) or asserting(negated, "type", "enum", "const") or not asserting(negated):
        return node
    try:
        allowed = declared_types(node) or set(TYPES)
        if set(asserting(negated)) == {"type"}:
            types = allowed - declared_types(negated)  # type: ignore[operator]
            if not types or ("number" in types and "integer" not in types):
                return node  # nothing left, or "numbers but not integers": no type says that
            rest = {k: v for k, v in node.items() if k != "not"}
            context.fired("not-type", pointer)
            return {**rest, "type": type_value(types)}
        if "type" in negated or not allowed <= {"boolean", "null"}:
            return node
        values = negated["enum"] if "enum" in negated else [negated.get("const")]
        universe = [v for v in (None, False, True) if json_type(v) in allowed]
        remaining = [v for v in universe if not any(json_equal(v, x) for x in values)]
    except CannotMerge:
        return node
    if not remaining:
        return node
    context.fired("not-values", pointer)
    rest = {k: v for k, v in node.items() if k not in ("not", "type")}
    return {**rest, "enum": remaining}
