"""The JSON-Schema checker that runs before xgrammar compiles a schema.

xgrammar compiles many schemas it does not fully enforce: it drops a keyword, sometimes with a
log line and sometimes silently, and the model is then free to write output the schema forbids.
This module finds those keywords *before* compiling, so that a strict constraint fails with a
message naming the keyword and its JSON pointer, and a best-effort one lists what is not enforced.

Every rule below was measured, not assumed: `python -m grammar.keyword_survey` runs the official
JSON-Schema test suite (draft 2020-12) plus our own probes through the real backend and checks
that no group with an accepted invalid instance goes unflagged (docs/constraints-keywords.md).
The rules are a whitelist over the known vocabulary: a known assertion keyword is enforced only in
the forms listed here; keywords outside JSON Schema's vocabulary ("x-foo", "nullable") assert
nothing by the spec, so they are ignored.

Also here: the size and depth limits of GrammarConfig, and `normalize`, which rewrites the two
schema shapes where xgrammar's strict mode would over-constrain (see its docstring).
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from grammar.backend import GrammarError

if TYPE_CHECKING:
    from engine.sampling_params import Constraint

# Keywords that assert nothing (annotations, identifiers, containers of definitions).
ANNOTATIONS = frozenset({
    "$schema", "$id", "$anchor", "$comment", "$vocabulary", "$defs", "definitions",
    "title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly",
    "contentEncoding", "contentMediaType", "contentSchema",  # annotations only in 2020-12
})

# Keywords with a meaning in some JSON-Schema draft that xgrammar 0.2.9 never enforces
# (measured: every invalid instance of their suite groups was accepted, or they are ignored).
NEVER_ENFORCED = {
    "uniqueItems": "duplicate items are not prevented",
    "contains": "no item is required to match",
    "minContains": "requires contains",
    "maxContains": "requires contains",
    "not": "negation is ignored",
    "if": "conditional schemas are ignored",
    "then": "conditional schemas are ignored",
    "else": "conditional schemas are ignored",
    "dependentRequired": "dependencies between properties are ignored",
    "dependentSchemas": "dependencies between properties are ignored",
    "dependencies": "dependencies between properties are ignored",
    "$dynamicRef": "dynamic references are not resolved",
    "$dynamicAnchor": "dynamic references are not resolved",
    "$recursiveRef": "recursive references are not resolved",
    "$recursiveAnchor": "recursive references are not resolved",
    "additionalItems": "draft-2019 tuple form is not supported",
}

# keyword -> the instance type it applies to; xgrammar ignores these unless "type" names it.
TYPED_KEYWORDS = {
    "minLength": "string", "maxLength": "string", "pattern": "string", "format": "string",
    "minimum": "number", "maximum": "number", "exclusiveMinimum": "number",
    "exclusiveMaximum": "number", "multipleOf": "number",
    "minItems": "array", "maxItems": "array",
    "required": "object", "minProperties": "object", "maxProperties": "object",
    "patternProperties": "object", "propertyNames": "object",
}
# xgrammar infers the type from these (narrowing, never loosening), so they need no "type".
TYPE_INFERRING = frozenset({"items", "prefixItems", "properties", "additionalProperties"})

# String formats xgrammar turns into a regex (measured with one valid and one invalid string each).
SUPPORTED_FORMATS = frozenset({
    "date", "date-time", "time", "duration", "email", "hostname", "ipv4", "ipv6",
    "uri", "uri-reference", "uri-template", "uuid", "json-pointer", "relative-json-pointer",
})

APPLICATORS = ("allOf", "anyOf", "oneOf")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_SINGLE = ("additionalProperties", "items", "contains", "propertyNames", "not", "if", "then",
                  "else", "unevaluatedItems", "unevaluatedProperties", "additionalItems", "contentSchema")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")


@dataclass(frozen=True)
class Finding:
    """One keyword the backend will not enforce, where it is, and why."""

    keyword: str
    pointer: str | None  # JSON pointer of the schema object holding it ("": the root; None: unknown)
    reason: str

    @property
    def location(self) -> str:
        if self.pointer is None:
            return "a location xgrammar does not report"
        return self.pointer or "/ (the root)"

    def __str__(self) -> str:  # the form listed in CompiledGrammar.not_enforced
        return f"{self.keyword} at {self.location}"

    @property
    def message(self) -> str:
        return f'unsupported keyword "{self.keyword}" at {self.location}: {self.reason}'


def pointer_join(pointer: str, *tokens: str | int) -> str:
    """Extend a JSON pointer, escaping "~" and "/" as RFC 6901 says."""
    for token in tokens:
        pointer += "/" + str(token).replace("~", "~0").replace("/", "~1")
    return pointer


def iter_subschemas(schema: Any, pointer: str = "") -> Iterator[tuple[str, Any, int]]:
    """Yield (pointer, schema, depth) for `schema` and every schema nested in it, root first.

    Iterative, so a hostile schema cannot exhaust Python's recursion limit. `depth` counts
    schema levels (the root is 1), not JSON brackets.
    """
    stack: list[tuple[str, Any, int]] = [(pointer, schema, 1)]
    while stack:
        ptr, node, depth = stack.pop()
        yield ptr, node, depth
        if not isinstance(node, dict):
            continue
        children: list[tuple[str, Any]] = []
        for key in _SCHEMA_MAPS:
            value = node.get(key)
            if isinstance(value, dict):
                children += [(pointer_join(ptr, key, name), sub) for name, sub in value.items()]
        for key in _SCHEMA_SINGLE:
            value = node.get(key)
            if isinstance(value, (dict, bool)):
                children.append((pointer_join(ptr, key), value))
        for key in _SCHEMA_LISTS:
            value = node.get(key)
            if isinstance(value, list):
                children += [(pointer_join(ptr, key, i), sub) for i, sub in enumerate(value)]
        deps = node.get("dependencies")
        if isinstance(deps, dict):  # draft 7: name -> schema or list of names
            children += [(pointer_join(ptr, "dependencies", n), s) for n, s in deps.items()
                         if isinstance(s, (dict, bool))]
        stack.extend((p, s, depth + 1) for p, s in reversed(children))


def check_limits(constraint: Constraint, max_spec_bytes: int, max_schema_depth: int) -> None:
    """Raise GrammarError if the spec is larger or (for a schema) deeper than the limits allow.

    Runs before anything expensive: the spec text is measured first, then the schema is parsed.
    """
    num_bytes = len(constraint.spec.encode()) + sum(len(c.encode()) for c in constraint.choices)
    if num_bytes > max_spec_bytes:
        raise GrammarError(f"{constraint.kind} spec is {num_bytes} bytes, over the max_spec_bytes "
                           f"limit of {max_spec_bytes}")
    if constraint.kind != "json_schema":
        return
    schema = parse_schema(constraint.spec, max_schema_depth)
    depth = max(d for _, _, d in iter_subschemas(schema))
    if depth > max_schema_depth:
        raise GrammarError(f"schema nesting depth is {depth}, over the max_schema_depth limit "
                           f"of {max_schema_depth}")


def parse_schema(spec: str, max_schema_depth: int | None = None) -> Any:
    """json.loads, with GrammarError (not RecursionError) for absurdly nested text."""
    try:
        return json.loads(spec)
    except RecursionError:
        limit = f" (the max_schema_depth limit is {max_schema_depth})" if max_schema_depth else ""
        raise GrammarError(f"schema is nested too deeply to parse{limit}") from None
    except json.JSONDecodeError as e:
        raise GrammarError(f"json_schema is not valid JSON: {e}") from None


def _types(node: dict) -> set[str] | None:
    declared = node.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return {t for t in declared if isinstance(t, str)}
    return None


def _has_type(types: set[str] | None, wanted: str) -> bool:
    if types is None:
        return False
    return wanted in types or (wanted == "number" and "integer" in types)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _conforms(value: Any, types: set[str]) -> bool:
    kind = _json_type(value)
    return kind in types or (kind == "integer" and "number" in types)


def _asserting(node: dict, *exclude: str) -> list[str]:
    """Keywords of `node` that assert something, in document order, minus `exclude`."""
    return [k for k in node if k not in ANNOTATIONS and k not in exclude]


def find_unsupported(schema: Any) -> list[Finding]:
    """Every keyword in `schema` that the xgrammar backend would not enforce, in document order.

    Pure and cheap (one walk); does not validate the schema itself — xgrammar reports malformed
    schemas when it compiles them.
    """
    uses_refs = any(isinstance(n, dict) and "$ref" in n for _, n, _ in iter_subschemas(schema))
    findings: list[Finding] = []
    for pointer, node, _ in iter_subschemas(schema):
        if isinstance(node, dict):
            findings += _check_node(node, pointer, uses_refs)
    return findings


def _check_node(node: dict, pointer: str, uses_refs: bool) -> list[Finding]:
    out: list[Finding] = []
    types = _types(node)

    def flag(keyword: str, reason: str) -> None:
        out.append(Finding(keyword, pointer, reason))

    for keyword in node:
        if keyword in NEVER_ENFORCED and not (keyword in ("then", "else") and "if" not in node):
            flag(keyword, NEVER_ENFORCED[keyword])
    if "$id" in node and pointer and uses_refs:
        flag("$id", "references are resolved against the document root, not an embedded $id")

    # Keywords that make xgrammar ignore their siblings: the schema becomes just that keyword.
    ref = node.get("$ref")
    if ref is not None:
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            flag("$ref", f"only local JSON-pointer references (#/...) are resolved, not {ref!r}")
        for keyword in _asserting(node, "$ref", *NEVER_ENFORCED):
            flag(keyword, "keywords beside $ref are ignored")
        return out
    for fixed in ("enum", "const"):
        if fixed in node:
            values = node[fixed] if fixed == "enum" and isinstance(node[fixed], list) else [node[fixed]]
            for keyword in _asserting(node, "enum", "const", *NEVER_ENFORCED):
                if keyword == "type" and types is not None and all(_conforms(v, types) for v in values):
                    continue  # every allowed value already has the declared type
                flag(keyword, f"keywords beside {fixed} are ignored")
            return out
    present = [k for k in APPLICATORS if k in node]
    if present:
        main = present[0]
        branches = node[main] if isinstance(node[main], list) else []
        if main == "allOf" and len(branches) > 1:
            flag("allOf", "only an allOf with a single subschema is supported")
        for keyword in _asserting(node, main, *NEVER_ENFORCED):
            if keyword == "type" and types is not None and _branches_within(branches, types):
                continue  # every branch declares a type inside the outer one
            flag(keyword, f"keywords beside {main} are ignored")
        return out

    for keyword, wanted in TYPED_KEYWORDS.items():
        if keyword in node and not _has_type(types, wanted):
            flag(keyword, f'ignored unless the schema declares "type": "{wanted}"')
    if _has_type(types, "string") and ("pattern" in node or "format" in node):
        for keyword in ("minLength", "maxLength"):
            if keyword in node:
                other = "pattern" if "pattern" in node else "format"
                flag(keyword, f"ignored when combined with {other}")
    fmt = node.get("format")
    if fmt is not None and _has_type(types, "string") and fmt not in SUPPORTED_FORMATS:
        flag("format", f"format {fmt!r} is not enforced (supported: {', '.join(sorted(SUPPORTED_FORMATS))})")
    if "multipleOf" in node and _has_type(types, "number"):
        value = node["multipleOf"]
        if types != {"integer"} or not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
            flag("multipleOf", 'enforced only with "type": "integer" and an integer divisor')
    required = node.get("required")
    if isinstance(required, list) and _has_type(types, "object"):
        declared = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        missing = [name for name in required if name not in declared]
        if missing:
            flag("required", f"names not declared in properties are not required: {missing}")
    if "unevaluatedProperties" in node and (not _has_type(types, "object") or "additionalProperties" in node):
        flag("unevaluatedProperties", 'enforced only in an object schema without additionalProperties')
    if "unevaluatedItems" in node and (not _has_type(types, "array") or "items" in node):
        flag("unevaluatedItems", 'enforced only in an array schema without items')
    return out


def _branches_within(branches: list, types: set[str]) -> bool:
    for branch in branches:
        branch_types = _types(branch) if isinstance(branch, dict) else None
        if branch_types is None or not all(_has_type(types, t) for t in branch_types):
            return False
    return True


def normalize(schema: Any) -> Any:
    """A copy of `schema` with the two shapes xgrammar's strict mode over-constrains made explicit.

    We compile with xgrammar's strict_mode (undeclared properties and items are not allowed),
    but xgrammar then reads an object that declares no properties at all as "no properties"
    whenever it carries another object keyword (maxProperties, minProperties...), and an array
    without items as "no items" when it carries minItems/maxItems/uniqueItems. Plain
    {"type": "object"} / {"type": "array"} already mean "anything" there; this makes every
    such schema mean the same by adding "additionalProperties": true / "items": true.
    The result accepts exactly what the schema does (JSON Schema's defaults), never more.
    """
    copy = json.loads(json.dumps(schema))
    for _, node, _ in iter_subschemas(copy):
        if not isinstance(node, dict) or "$ref" in node or "enum" in node or "const" in node:
            continue
        types = _types(node)
        if _has_type(types, "object") and not any(
                k in node for k in ("properties", "patternProperties", "additionalProperties",
                                    "unevaluatedProperties")):
            node["additionalProperties"] = True
        if _has_type(types, "array") and not any(
                k in node for k in ("items", "prefixItems", "unevaluatedItems")):
            node["items"] = True
    return copy
