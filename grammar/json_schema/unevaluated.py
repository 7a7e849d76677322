"""Rewrite rule for `unevaluatedProperties`, which neither backend enforces where other schemas
beside it evaluate properties: dropped where every property is evaluated anyway, written as
`additionalProperties` where nothing beside it evaluates any.

A property is evaluated by `properties`, `patternProperties` or `additionalProperties` of the
node or of a subschema applied to the same instance. An `additionalProperties` (any schema,
`false` included) in the node or in a conjunct that must hold (an `allOf` branch, a `$ref`
target, followed through) evaluates every property its `properties` and patterns do not, so
unevaluatedProperties never applies in a valid instance: dropping it is exact. In a node with no
applicator at all, the unevaluated properties are the ones additionalProperties would see:
writing it so is exact. Anything else (an anyOf, oneOf, if or dependentSchemas beside it, whose
evaluation depends on which branch holds) stays for the checker.
"""
from __future__ import annotations

from typing import Any

from grammar.json_schema.rule import RuleContext
from grammar.json_schema.walk import resolve_pointer

# keywords that apply another schema to the same instance, and so may evaluate properties
_IN_PLACE = ("allOf", "anyOf", "oneOf", "not", "if", "then", "else", "$ref", "$dynamicRef", "$recursiveRef",
             "dependentSchemas", "dependencies")
_MAX_CONJUNCTS = 64


def unevaluated_properties(node: dict, pointer: str, context: RuleContext) -> Any:
    """unevaluatedProperties dropped where an additionalProperties of a conjunct evaluates every
    property, or renamed additionalProperties where nothing else evaluates any (exact)."""
    if "unevaluatedProperties" not in node:
        return node
    rest = {k: v for k, v in node.items() if k != "unevaluatedProperties"}
    if _evaluates_all(node, context.root):
        context.fired("unevaluatedProperties", pointer)
        return rest
    if not any(k in node for k in (*_IN_PLACE, "additionalProperties")):
        context.fired("unevaluatedProperties", pointer)
        return {**rest, "additionalProperties": node["unevaluatedProperties"]}
    return node


def _evaluates_all(node: dict, root: Any) -> bool:
    """Whether `node` or a conjunct it requires (allOf branches, local $ref targets) has an
    additionalProperties. Follows each reference once, so a cycle ends."""
    stack, seen = [node], set()
    while stack and len(seen) < _MAX_CONJUNCTS:
        schema = stack.pop()
        if not isinstance(schema, dict):
            continue
        if "additionalProperties" in schema:
            return True
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/") and ref not in seen:
            seen.add(ref)
            stack.append(resolve_pointer(root, ref))
        if isinstance(schema.get("allOf"), list):
            stack.extend(schema["allOf"])
    return False
