"""Rewrite rules that write down what a schema leaves implicit: the type its keywords describe,
and the schema a required-but-undeclared property gets anyway."""
from __future__ import annotations

import re
from typing import Any

from grammar.backend import GrammarError
from grammar.json_schema.merge import type_value
from grammar.json_schema.one_of import instance_types
from grammar.json_schema.rule import RuleContext

# keyword -> the instance type it describes
_FAMILIES = {
    **dict.fromkeys(("minLength", "maxLength", "pattern", "format"), "string"),
    **dict.fromkeys(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"), "number"),
    **dict.fromkeys(("items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains"), "array"),
    **dict.fromkeys(("properties", "additionalProperties", "required", "minProperties", "maxProperties",
                     "patternProperties", "propertyNames", "dependentRequired", "dependencies"), "object"),
}


def infer_type(node: dict, pointer: str, context: RuleContext) -> Any:
    """An untyped schema whose keywords all describe one type gets that type (narrowing:
    other types were allowed before, unconstrained)."""
    if not context.monotone or "type" in node or any(
            k in node for k in ("$ref", "enum", "const", "anyOf", "oneOf", "allOf", "not")):
        return node
    families = {_FAMILIES[k] for k in node if k in _FAMILIES}
    if len(families) != 1:
        return node
    context.fired("infer-type", pointer, narrowing=True)
    return {**node, "type": families.pop()}


def undeclared_required(node: dict, pointer: str, context: RuleContext) -> Any:
    """A required name missing from properties is declared with the schema that applies to it
    anyway (the matching patternProperties, else additionalProperties): exact, in an object or
    a schema of several types (properties apply to objects only). A closed object that requires a
    name nothing declares allows no object: the node keeps its other types, or becomes false
    (exact), and at the root that is an error naming the names."""
    required = node.get("required")
    types = instance_types(node)
    if not isinstance(required, list) or types is None or "object" not in types or "$ref" in node:
        return node
    properties = node.get("properties", {})
    if not isinstance(properties, dict):
        return node
    missing = [n for n in required if isinstance(n, str) and n not in properties]
    if not missing:
        return node
    additional = node.get("additionalProperties", True)
    patterns = node.get("patternProperties", {})
    added, impossible = {}, []
    for name in missing:
        try:
            matching = [s for p, s in patterns.items() if re.search(p, name)] if isinstance(patterns, dict) else []
        except re.error:
            return node
        if len(matching) > 1:
            return node
        schema = matching[0] if matching else additional
        if schema is False:
            impossible.append(name)
        elif not isinstance(schema, (dict, bool)):
            return node
        added[name] = schema
    if impossible:
        if types != {"object"}:  # only the other types are left
            if "enum" in node or "const" in node:
                return node
            context.fired("required-undeclared-closed", pointer)
            return {**node, "type": type_value(types - {"object"})}
        if not pointer:
            raise GrammarError(f"the schema allows no value: it requires {impossible}, which its properties do not "
                               "declare, and additionalProperties is false")
        context.fired("required-undeclared-closed", pointer)
        return False
    context.fired("required-declared", pointer)
    return {**node, "properties": {**properties, **added}}
