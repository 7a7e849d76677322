"""The JSON-Schema checker that runs before xgrammar compiles a schema.

xgrammar compiles many schemas it does not fully enforce: it drops a keyword, sometimes with a
log line and sometimes silently, and the model is then free to write output the schema forbids.
This module finds those keywords *before* compiling, so that a strict constraint fails with a
message naming the keyword and its JSON pointer, and a best-effort one lists what is not enforced.

Every rule below was measured, not assumed: `python -m bench.keyword_survey` runs the official
JSON-Schema test suite (draft 2020-12) plus our own probes through the real backend and checks
that no group with an accepted invalid instance goes unflagged (docs/constraints-keywords.md).
The rules are a whitelist over the known vocabulary: a known assertion keyword is enforced only in
the forms listed here; keywords outside JSON Schema's vocabulary ("x-foo", "nullable") assert
nothing by the spec, so they are ignored.

Also here: `normalize`, which rewrites the two
schema shapes where xgrammar's strict mode would over-constrain (see its docstring). Keyword
values that are malformed whatever the mode ("maxLength": -1) are grammar/json_schema/values.py's.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from grammar.json_schema.json_text_pattern import json_text_pattern
from grammar.json_schema.merge import json_type
from grammar.json_schema.pattern_names import overlapping_pattern_schemas
from grammar.json_schema.walk import APPLICATORS, ASSERTIONS, iter_subschemas, resolve_pointer

# String formats xgrammar turns into a regex (measured with one valid and one invalid string each):
# the rewrite drops the rest as annotations (XGrammarBackend.enforced_formats), and they are reported here
ENFORCED_FORMATS = frozenset({
    "date", "date-time", "time", "duration", "email", "hostname", "ipv4", "ipv6",
    "uri", "uri-reference", "uri-template", "uuid", "json-pointer", "relative-json-pointer",
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
    "$recursiveRef": "recursive references are not resolved",
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
# Without "type", xgrammar reads a schema with these keywords as an object / an array
# (narrowing, never loosening) and then enforces that type's keywords too.
_INFERS_OBJECT = ("properties", "additionalProperties")
_INFERS_ARRAY = ("items", "prefixItems")

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


def _types(node: Any) -> set[str] | None:
    """The instance types `node` enforces: declared, or inferred as xgrammar does; None: any."""
    if not isinstance(node, dict):
        return None
    declared = node.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return {t for t in declared if isinstance(t, str)}
    if "enum" in node or "const" in node:
        values = node["enum"] if isinstance(node.get("enum"), list) else [node.get("const")]
        return {json_type(v) for v in values}
    if any(k in node for k in _INFERS_OBJECT):
        return {"object"}
    if any(k in node for k in _INFERS_ARRAY):
        return {"array"}
    return None


def _has_type(types: set[str] | None, wanted: str) -> bool:
    if types is None:
        return False
    return wanted in types or (wanted == "number" and "integer" in types)


def _asserting(node: dict, *exclude: str) -> list[str]:
    """Keywords of `node` that assert something, in document order, minus `exclude`."""
    return [k for k in node if k in ASSERTIONS and k not in exclude]


def _within(inner: set[str] | None, outer: set[str] | None) -> bool:
    """Every type of `inner` is allowed by `outer` (so an outer "type" adds nothing)."""
    if inner is None or outer is None:
        return False
    return all(t in outer or (t == "integer" and "number" in outer) for t in inner)


def find_unsupported(schema: Any) -> list[Finding]:
    """Every keyword in `schema` that the xgrammar backend would not enforce, in document order.

    Pure and cheap (one walk); does not validate the schema itself — xgrammar reports malformed
    schemas when it compiles them.
    """
    uses_refs = any(isinstance(n, dict) and "$ref" in n for _, n, _ in iter_subschemas(schema))
    findings: list[Finding] = []
    for pointer, node, _ in iter_subschemas(schema):
        if isinstance(node, dict):
            findings += _check_node(node, pointer, schema, uses_refs)
    return findings


def _check_node(node: dict, pointer: str, root: Any, uses_refs: bool) -> list[Finding]:
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
        target = resolve_pointer(root, ref) if isinstance(ref, str) else None
        for keyword in _asserting(node, "$ref", *NEVER_ENFORCED):
            if keyword == "type" and _within(_types(target), types):
                continue  # the referenced schema already has (a subset of) this type
            flag(keyword, "keywords beside $ref are ignored")
        return out
    for fixed in ("enum", "const"):
        if fixed in node:
            values = node[fixed] if fixed == "enum" and isinstance(node[fixed], list) else [node[fixed]]
            for keyword in _asserting(node, "enum", "const", *NEVER_ENFORCED):
                if keyword == "type" and _within({json_type(v) for v in values}, _declared(node)):
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
            if keyword == "type" and branches and all(_within(_branch_types(b, root), types) for b in branches):
                continue  # every branch already has (a subset of) the outer type
            flag(keyword, f"keywords beside {main} are ignored")
        return out

    if types is None:  # with a declared type that excludes theirs, these keywords are no-ops
        for keyword, wanted in TYPED_KEYWORDS.items():
            if keyword in node:
                flag(keyword, f'ignored unless the schema declares "type": "{wanted}"')
    if _has_type(types, "string") and ("pattern" in node or "format" in node):
        for keyword in ("minLength", "maxLength"):
            if keyword in node:
                other = "pattern" if "pattern" in node else "format"
                flag(keyword, f"ignored when combined with {other}")
    if _has_type(types, "string") and isinstance(node.get("pattern"), str) and \
            json_text_pattern(node["pattern"]) is None:
        flag("pattern", "a pattern that matches a quote or a backslash is not enforced in this form (in a class "
                        "beside other characters, with |, in a range, beside a back-reference): xgrammar matches "
                        "it against the JSON text, where those characters are escaped")
    fmt = node.get("format")
    if fmt is not None and _has_type(types, "string") and fmt not in ENFORCED_FORMATS:
        flag("format", f"format {fmt!r} is not enforced (supported: {', '.join(sorted(ENFORCED_FORMATS))})")
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
    patterns = node.get("patternProperties")
    if isinstance(patterns, dict) and _has_type(types, "object") and _overlapping_patterns(node, patterns):
        flag("patternProperties", "a name matched by several patterns or properties is checked against one of them")
    for keyword, wanted, sibling in (("unevaluatedProperties", "object", "additionalProperties"),
                                     ("unevaluatedItems", "array", "items")):
        if keyword in node and (types is None or (_has_type(types, wanted) and sibling in node)):
            flag(keyword, f"enforced only in a typed {wanted} schema without {sibling}")
    return out


def _overlapping_patterns(node: dict, patterns: dict) -> bool:
    """Patterns with different schemas that a name may match two of (not told apart), or a
    pattern that matches a declared property with a different schema: xgrammar would check the
    name against only one."""
    declared = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    if overlapping_pattern_schemas(patterns):
        return True
    try:
        return any(re.search(p, name) and declared[name] != s for p, s in patterns.items() for name in declared)
    except re.error:
        return True


def _declared(node: dict) -> set[str] | None:
    declared = node.get("type")
    if isinstance(declared, str):
        return {declared}
    return {t for t in declared if isinstance(t, str)} if isinstance(declared, list) else None


def _branch_types(branch: Any, root: Any) -> set[str] | None:
    """A branch's types, following one local $ref (a branch is often just a reference)."""
    if isinstance(branch, dict) and isinstance(branch.get("$ref"), str) and len(_asserting(branch)) == 1:
        branch = resolve_pointer(root, branch["$ref"])
    return _types(branch)


def normalize(schema: Any) -> Any:
    """A copy of `schema` with the two shapes xgrammar's strict mode over-constrains made explicit.

    We compile with xgrammar's strict_mode (undeclared properties and items are not allowed),
    but xgrammar then reads an object that declares no properties at all as "no properties"
    whenever it carries another object keyword (maxProperties, minProperties...), and an array
    without items as "no items" when it carries minItems/maxItems/uniqueItems. Plain
    {"type": "object"} / {"type": "array"} already mean "anything" there; this makes every
    such schema mean the same by adding "additionalProperties": true / "items": true.
    The result accepts exactly what the schema does (JSON Schema's defaults), never more. xgrammar
    matches a `pattern` against the JSON text of a string, so one naming a quote or a backslash is
    written in that form (grammar/json_schema/json_text_pattern.py), or dropped where it cannot be
    (find_unsupported reports it: strict mode refuses the schema first).
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
        if isinstance(node.get("pattern"), str):
            text_pattern = json_text_pattern(node["pattern"])
            if text_pattern is None:
                del node["pattern"]  # reported as not enforced; kept, it would let out a string that is not JSON
            else:
                node["pattern"] = text_pattern
    return copy
