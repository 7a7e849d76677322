"""Rewrite rule for `propertyNames`, which neither backend enforces: dropped where it holds for
every name the object may have, or written into the declared properties where those are all the
names it may have.

A property name is always a string, so `propertyNames` of `true`, `{}` or `{"type": "string"}`
says nothing; of `false`, no property at all (maxProperties 0). In an object whose
`additionalProperties` is false and that has no `patternProperties`, the names are the declared
ones: each is checked against propertyNames here, and one it refuses gets the schema `false`
(the property may not appear). Every form is exact; a propertyNames that a name cannot be
checked against here (a keyword merge.accepts does not know, a pattern Python cannot read) stays
for the checker.
"""
from __future__ import annotations

from typing import Any

from grammar.json_schema.merge import ANNOTATIONS, CannotMerge, accepts
from grammar.json_schema.rule import RuleContext


def property_names(node: dict, pointer: str, context: RuleContext) -> Any:
    """propertyNames dropped where every name holds it, turned into maxProperties 0 for false,
    or into false properties for the declared names it refuses in a closed object (exact)."""
    if "propertyNames" not in node:
        return node
    rest = {k: v for k, v in node.items() if k != "propertyNames"}
    try:
        names = context.resolved(node["propertyNames"])
    except CannotMerge:
        return node
    if names is True or (isinstance(names, dict) and _says_nothing_of_strings(names)):
        context.fired("propertyNames", pointer)
        return rest
    if names is False:
        context.fired("propertyNames", pointer)
        limit = rest.get("maxProperties")
        return {**rest, "maxProperties": 0 if not isinstance(limit, int) else min(limit, 0)}
    declared = node.get("properties", {})
    if node.get("additionalProperties") is not False or "patternProperties" in node or not isinstance(declared, dict):
        return node
    try:
        refused = [name for name in declared if not accepts(names, name)]
    except CannotMerge:
        return node
    context.fired("propertyNames", pointer)
    return {**rest, "properties": {n: False if n in refused else s for n, s in declared.items()}}


def _says_nothing_of_strings(names: dict) -> bool:
    return all(k in ANNOTATIONS or (k == "type" and v == "string") for k, v in names.items())
