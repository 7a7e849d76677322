"""A JSON-Schema constraint as llguidance's JSON compiler reads it: the rewritten schema with
xgrammar's closed-object reading made explicit, the whitespace mode as compiler options, and
llguidance's "Unimplemented keys" message turned into "keyword at /pointer" entries."""
from __future__ import annotations

import json
import re
from typing import Any

from grammar.constraint import BOUNDED_JSON_WHITESPACE
from grammar.json_schema.walk import iter_subschemas

# JSON whitespace mode (Constraint.json_whitespace) -> llguidance's JSON compiler options
WHITESPACE_OPTIONS: dict[str, dict[str, Any]] = {
    "compact": {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"},
    "spaced": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
    "bounded": {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":",
                "whitespace_pattern": rf"[\x20\x0A\x0D\x09]{{0,{BOUNDED_JSON_WHITESPACE}}}"},
    "any": {"whitespace_flexible": True},
}
# the string formats llguidance 1.9 checks (measured with one valid and one invalid string each);
# it refuses any other name ("Unknown format"), so the rewrite drops those as annotations first
ENFORCED_FORMATS = frozenset({
    "date", "date-time", "time", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uuid",
})
_UNIMPLEMENTED = re.compile(r"Unimplemented keys: \[([^\]]*)\]")


def closed_schema(schema: Any) -> Any:
    """A copy of `schema` where an object that declares properties but says nothing of others
    allows no others, and a tuple (prefixItems) without `items` has no more items: what Formwork
    promises on either backend (xgrammar's strict mode), so the model cannot invent keys."""
    copy = json.loads(json.dumps(schema))
    for _, node, _ in iter_subschemas(copy):
        if not isinstance(node, dict):
            continue
        if "properties" in node and not any(k in node for k in ("additionalProperties", "patternProperties",
                                                                  "unevaluatedProperties")):
            node["additionalProperties"] = False
        if "prefixItems" in node and not any(k in node for k in ("items", "unevaluatedItems")):
            node["items"] = False
    return copy


def unimplemented_keywords(message: str) -> list[str]:
    """The keywords an llguidance error or warning names as not implemented ([] for another message)."""
    match = _UNIMPLEMENTED.search(message)
    if match is None:
        return []
    return [k.strip().strip('"') for k in match.group(1).split(",") if k.strip()]


def keyword_locations(schema: Any, keywords: list[str]) -> list[str]:
    """ "keyword at /pointer" for each subschema of `schema` holding one of `keywords`, the form
    CompiledGrammar.not_enforced lists; a keyword found nowhere is listed without a place."""
    out: list[str] = []
    for keyword in keywords:
        found = [p or "/ (the root)" for p, node, _ in iter_subschemas(schema)
                 if isinstance(node, dict) and keyword in node]
        out += [f"{keyword} at {p}" for p in found] or [f"{keyword} at a location llguidance does not report"]
    return out
