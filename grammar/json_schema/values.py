"""Keyword values a schema must have whatever the mode: `"maxLength": -1` or `"pattern": 5`
means nothing, so it is refused with the keyword and its JSON pointer before xgrammar reads it
(whose own messages are internal assertions), as is a pattern whose repetition counts are over
the server's limit."""
from __future__ import annotations

import json
import math
from typing import Any

from grammar.backend import GrammarError
from grammar.json_schema.walk import APPLICATORS, SINGLE_SUBSCHEMA_KEYWORDS, SUBSCHEMA_MAP_KEYWORDS, iter_subschemas
from grammar.regex.repeat_counts import find_large_repeat

_COUNTS = ("maxLength", "minLength", "maxItems", "minItems", "maxContains", "minContains",
           "maxProperties", "minProperties")
_NUMBERS = ("minimum", "maximum")


def check_keyword_values(schema: Any, max_repeat_count: int) -> None:
    """Raise GrammarError, naming the keyword and its JSON pointer, for a keyword whose value is
    not of the form JSON Schema defines ("maxLength": -1, "pattern": 5), or a pattern with a
    repetition count over `max_repeat_count`. Strict or not: such a schema means nothing."""
    problems: list[str] = []
    for pointer, node, _ in iter_subschemas(schema):
        if not isinstance(node, (dict, bool)):
            problems.append(f"the subschema at {pointer or '/ (the root)'} must be an object or a boolean, "
                            f"got {_show(node)}")
        elif isinstance(node, dict):
            problems += _keyword_problems(node, pointer, max_repeat_count)
        if len(problems) >= 5:
            break
    if problems:
        raise GrammarError("json_schema does not compile: " + "; ".join(problems[:5]))


def _keyword_problems(node: dict, pointer: str, max_repeat_count: int) -> list[str]:
    out: list[str] = []
    where = pointer or "/ (the root)"

    def bad(keyword: str, expected: str) -> None:
        out.append(f'"{keyword}" at {where} must be {expected}, got {_show(node[keyword])}')

    for keyword in _COUNTS:
        if keyword in node and not _is_count(node[keyword]):
            bad(keyword, "a non-negative integer")
    for keyword in _NUMBERS:
        if keyword in node and not _is_number(node[keyword]):
            bad(keyword, "a number")
    for keyword in ("exclusiveMinimum", "exclusiveMaximum"):  # draft 4: booleans
        if keyword in node and not (_is_number(node[keyword]) or isinstance(node[keyword], bool)):
            bad(keyword, "a number")
    if "multipleOf" in node and not (_is_number(node["multipleOf"]) and node["multipleOf"] > 0):
        bad("multipleOf", "a number > 0")
    for keyword in ("pattern", "format", "$ref"):
        if keyword in node and not isinstance(node[keyword], str):
            bad(keyword, "a string")
    if isinstance(node.get("pattern"), str):
        out += _repeat_problems(node["pattern"], f'"pattern" at {where}', max_repeat_count)
    declared = node.get("type")  # its names are xgrammar's to check: it names an unknown one itself
    if "type" in node and not (isinstance(declared, str) or (
            isinstance(declared, list) and declared and all(isinstance(t, str) for t in declared))):
        bad("type", "a type name or a non-empty list of them")
    if "required" in node and not (isinstance(node["required"], list)
                                   and all(isinstance(n, str) for n in node["required"])):
        bad("required", "a list of strings")
    if "enum" in node and not isinstance(node["enum"], list):
        bad("enum", "a list")
    if "uniqueItems" in node and not isinstance(node["uniqueItems"], bool):
        bad("uniqueItems", "a boolean")
    for keyword in SUBSCHEMA_MAP_KEYWORDS:
        if keyword in node and not isinstance(node[keyword], dict):
            bad(keyword, "an object of subschemas")
    if isinstance(node.get("patternProperties"), dict):
        for name in node["patternProperties"]:
            out += _repeat_problems(name, f'the "patternProperties" key {name!r} at {where}', max_repeat_count)
    for keyword in SINGLE_SUBSCHEMA_KEYWORDS:
        if keyword in node and not isinstance(node[keyword], (dict, bool)) and not (
                keyword == "items" and isinstance(node[keyword], list)):
            bad(keyword, "a subschema (an object or a boolean)")
    for keyword in APPLICATORS:
        if keyword in node and not (isinstance(node[keyword], list) and node[keyword]):
            bad(keyword, "a non-empty list of subschemas")
    if "prefixItems" in node and not isinstance(node["prefixItems"], list):
        bad("prefixItems", "a list of subschemas")
    return out


def _repeat_problems(pattern: str, what: str, max_repeat_count: int) -> list[str]:
    found = find_large_repeat(pattern, max_repeat_count)
    if found is None:
        return []
    count, offset = found
    return [f"{what} has the repetition count {count} (at character {offset}), over this server's "
            f"max_repeat_count limit of {max_repeat_count}"]


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def _is_count(value: Any) -> bool:
    """A non-negative integer as JSON Schema counts it (2.0 is an integer)."""
    return _is_number(value) and value >= 0 and (isinstance(value, int) or value.is_integer())


def _show(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (ValueError, RecursionError):  # NaN is fine in json.dumps; a deep value may not be
        text = type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."
