"""`multipleOf` 10^-k on a number enforced as its text: at most k fraction digits, no exponent.

xgrammar 0.2.9 cannot enforce `{"type": "number", "multipleOf": 0.01}` (a price in cents); an
integer would lose the cents. The numbers whose text has at most k digits after the point and no
exponent are exactly multiples of 10^-k, so such a node gets a number rule of its own: it is
replaced by a marker constant for xgrammar's JSON-schema conversion, and the marker's literal in
the grammar text by the rule. A flagged narrowing: `1e-2`, `0.100` (zeros past k digits) and
`-0` beside `minimum: 0` are multiples too, and are left out.

Bounds: none, `minimum: 0` (no sign), and `minimum: 0` with a maximum of n nines and k nines
after the point (at most n integer digits). Other keywords beside it, or a place where a
narrower subschema can widen the schema (under `not`, `if`/`then`/`else`, `contains`, a oneOf's
branches, and definitions that such a place refers to), leave the node as it was, so the checker
still reports it. Pure JSON and text.
"""
from __future__ import annotations

from decimal import Decimal
from typing import Any

MARKER = "__formwork_decimal_{}__"
MAX_FRACTION_DIGITS = 18
MAX_INTEGER_DIGITS = 40

_ANNOTATIONS = {"title", "description", "default", "examples", "example", "$comment", "readOnly", "writeOnly",
                "deprecated", "$id", "id"}
_NON_MONOTONE = {"not", "if", "then", "else", "contains", "oneOf"}
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SINGLES = ("additionalProperties", "items", "contains", "not", "if", "then", "else", "additionalItems",
            "unevaluatedItems", "unevaluatedProperties")
_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")


def fraction_digits(multiple: Any) -> int | None:
    """k where `multiple` is exactly 10^-k (0.1, 0.01, ...), else None."""
    if isinstance(multiple, bool) or not isinstance(multiple, float) or not 0 < multiple < 1:
        return None
    exponent = Decimal(repr(multiple)).normalize().as_tuple()
    if exponent.digits != (1,) or not 1 <= -exponent.exponent <= MAX_FRACTION_DIGITS:
        return None
    return -exponent.exponent


def number_ebnf(digits: int, signed: bool, max_integer_digits: int | None) -> str:
    """The EBNF of a JSON number with at most `digits` fraction digits and no exponent."""
    integer = '"0" | [1-9] [0-9]*' if max_integer_digits is None else \
        ('"0"' if max_integer_digits == 1 else f'"0" | [1-9] [0-9]{{0, {max_integer_digits - 1}}}')
    sign = '"-"? ' if signed else ""
    return f'({sign}({integer}) ("." [0-9]{{1, {digits}}})?)'


def number_rule(node: dict) -> str | None:
    """The EBNF that enforces the number node `node`, or None where this does not apply."""
    types = node.get("type")
    if types not in ("number", ["number"]):
        return None
    digits = fraction_digits(node.get("multipleOf"))
    if digits is None or set(node) - _ANNOTATIONS - {"type", "multipleOf", "minimum", "maximum"}:
        return None
    minimum, maximum = node.get("minimum"), node.get("maximum")
    if minimum is None and maximum is None:
        return number_ebnf(digits, True, None)
    if not _is_zero(minimum):
        return None
    if maximum is None:
        return number_ebnf(digits, False, None)
    integer_digits = _nines(maximum, digits)
    return None if integer_digits is None else number_ebnf(digits, False, integer_digits)


def mark(schema: Any) -> tuple[Any, dict[str, str]]:
    """A copy of `schema` with each number node this enforces replaced by a marker constant (a
    nullable one by an anyOf of the marker and null), and marker literal -> EBNF for
    `substitute`. The input is not modified."""
    rules: dict[str, str] = {}
    refs_narrowable = not _refers_from_non_monotone(schema, True)

    def visit(node: Any, monotone: bool) -> Any:
        if not isinstance(node, dict):
            return node
        if monotone:
            marked = _marked(node, rules)
            if marked is not None:
                return marked
        out = dict(node)
        for key in _MAPS:
            if isinstance(out.get(key), dict):
                inner = monotone and (refs_narrowable or key not in ("$defs", "definitions"))
                out[key] = {name: visit(sub, inner) for name, sub in out[key].items()}
        for key in _SINGLES:
            if isinstance(out.get(key), dict):
                out[key] = visit(out[key], monotone and key not in _NON_MONOTONE)
        for key in _LISTS:
            if isinstance(out.get(key), list):
                out[key] = [visit(sub, monotone and key not in _NON_MONOTONE) for sub in out[key]]
        return out

    return visit(schema, True), rules


def substitute(grammar_text: str, rules: dict[str, str]) -> str | None:
    """`grammar_text` with each marker's literal made its number rule; None if a marker is
    found anywhere else (xgrammar joined it with other text), so the caller can refuse."""
    for marker, ebnf in rules.items():
        grammar_text = grammar_text.replace(f'"\\"{marker}\\""', ebnf)
        if marker in grammar_text:
            return None
    return grammar_text


def _marked(node: dict, rules: dict[str, str]) -> Any:
    types = node.get("type")
    nullable = isinstance(types, list) and len(types) == 2 and "null" in types and "number" in types
    ebnf = number_rule({**node, "type": "number"} if nullable else node)
    if ebnf is None:
        return None
    marker = MARKER.format(len(rules))
    rules[marker] = ebnf
    return {"anyOf": [{"const": marker}, {"type": "null"}]} if nullable else {"const": marker}


def _refers_from_non_monotone(node: Any, monotone: bool) -> bool:
    """Whether a `$ref` sits where narrowing what it refers to could widen the schema."""
    if not isinstance(node, dict):
        return False
    if "$ref" in node and not monotone:
        return True
    children = [(sub, key) for key in _MAPS if isinstance(node.get(key), dict) for sub in node[key].values()]
    children += [(node[key], key) for key in _SINGLES if isinstance(node.get(key), dict)]
    children += [(sub, key) for key in _LISTS if isinstance(node.get(key), list) for sub in node[key]]
    children += [(node["propertyNames"], "propertyNames")] if isinstance(node.get("propertyNames"), dict) else []
    return any(_refers_from_non_monotone(sub, monotone and key not in _NON_MONOTONE) for sub, key in children)


def _is_zero(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


def _nines(maximum: Any, digits: int) -> int | None:
    """n where `maximum` is n nines, a point and `digits` nines (99.99 for n 2, digits 2)."""
    if isinstance(maximum, bool) or not isinstance(maximum, (int, float)):
        return None
    for n in range(1, MAX_INTEGER_DIGITS + 1):
        if Decimal(repr(maximum)) == Decimal("9" * n + "." + "9" * digits):
            return n
    return None
