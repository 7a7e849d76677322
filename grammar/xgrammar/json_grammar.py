"""A JSON schema's xgrammar grammar and the checks of its bounds: the pure-Python part of an
xgrammar compile, which needs no tokenizer, so that it can run in the schema worker
(grammar/schema_worker.py) as well as in the engine's process."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import xgrammar as xgr

from grammar.backend import GrammarError
from grammar.constraint import BOUNDED_JSON_WHITESPACE
from grammar.json_schema.limits import parse_schema
from grammar.json_schema.rewrite import rewrite
from grammar.json_schema.values import check_keyword_values
from grammar.json_schema.walk import iter_subschemas
from grammar.runtime.closing_hints import closing_hints
from grammar.xgrammar import decimal_numbers, output_bounds
from grammar.xgrammar.conversion import unsupported_error, warning_keywords, with_decimal_numbers
from grammar.xgrammar.log_capture import capture_native_log, strip_native_prefix
from grammar.xgrammar.schema_gaps import ENFORCED_FORMATS, Finding, find_unsupported, normalize

if TYPE_CHECKING:
    from grammar.config import GrammarConfig
    from grammar.constraint import Constraint

logger = logging.getLogger(__name__)

# JSON whitespace mode (Constraint.json_whitespace) -> xgrammar's JSON-schema options
WHITESPACE_OPTIONS: dict[str, dict[str, Any]] = {
    "compact": {"any_whitespace": False, "separators": (",", ":")},
    "spaced": {"any_whitespace": False, "separators": (", ", ": ")},
    "bounded": {"any_whitespace": True, "max_whitespace_cnt": BOUNDED_JSON_WHITESPACE},
    "any": {"any_whitespace": True},
}
_ONE_OF_WARNING = "oneOf with overlapping"
# one character of a length-bounded string as xgrammar writes it, and without the control characters
# JSON forbids raw (an alternative of escapes beside it made fills of maxLength 2,000 take 134 ms)
_BOUNDED_STRING_CHARACTER = r'(([^\"\\\r\n]))'
_JSON_STRING_CHARACTER = r'(([^\0-\x1f\"\\]))'


@dataclass
class PreparedJson:
    """A json_schema constraint's grammar, checked, as plain data the engine's process rebuilds."""

    ebnf: str  # the grammar's text (xgr.Grammar.from_ebnf of it is the grammar the bounds are of)
    not_enforced: list[str] = field(default_factory=list)
    bounds: output_bounds.OutputBounds | None = None
    closing_hints: list[str] = field(default_factory=list)  # grammar/runtime/closing_hints.py


def prepare(constraint: Constraint, config: GrammarConfig) -> PreparedJson:
    """The grammar of a json_schema constraint without a think section, its bounds checked
    (check_bounds' GrammarErrors), and its closing hints."""
    grammar, notes = json_grammar(constraint, config.max_repeat_count)
    grammar = xgr.Grammar.from_ebnf(str(grammar))  # what the engine's process rebuilds from the text
    bounds = check_bounds(constraint.kind, grammar, config.max_forced_bytes)
    return PreparedJson(str(grammar), notes, bounds, closing_hints(constraint))


def json_grammar(constraint: Constraint, max_repeat_count: int, decimals: bool = True) -> tuple[xgr.Grammar, list[str]]:
    """A json_schema or json_object constraint's grammar and what it does not enforce.
    `decimals`: numbers with a multipleOf of 10^-k get a rule of their own
    (grammar/xgrammar/decimal_numbers.py); without it they are reported as findings."""
    numbers: dict[str, str] = {}
    if constraint.kind == "json_object":
        schema: Any = {"type": "object"}
        findings: list[Finding] = []
        notes: list[str] = []
    else:
        parsed = parse_schema(constraint.spec)
        # malformed keyword values are named before the rewrite reads them
        check_keyword_values(parsed, max_repeat_count)
        rewritten = rewrite(parsed, ENFORCED_FORMATS)
        schema, notes = rewritten.schema, rewritten.notes
        if decimals:
            schema, numbers = decimal_numbers.mark(schema)
        findings = find_unsupported(schema)
    if constraint.strict and findings:
        raise unsupported_error(findings)
    text = json.dumps(normalize(schema))
    with capture_native_log() as log_lines:
        grammar = _json_to_grammar(text, constraint.json_whitespace)
    for finding in _findings_from_log(log_lines, schema, findings, constraint.json_whitespace):
        findings.append(finding)
        if constraint.strict:
            raise unsupported_error([finding])
    with_numbers = with_decimal_numbers(grammar, numbers)
    if with_numbers is None:
        return json_grammar(constraint, max_repeat_count, decimals=False)
    return with_json_characters(with_numbers), [str(f) for f in findings] + notes


def with_json_characters(grammar: xgr.Grammar) -> xgr.Grammar:
    """The grammar with no raw control character in a length-bounded string.

    xgrammar 0.2.9 writes a string with minLength/maxLength as `"\"" name{min, max} "\""` with
    `name ::= (([^\"\\\r\n]))`: a raw tab or other control character passes, which is not JSON
    (a strict parser refuses the output). Each such rule loses them. No escape passes either way:
    such a string's value holds no quote, backslash or control character (a narrowing, in
    docs/constraints.md)."""
    text = str(grammar)
    lines = text.split("\n")
    for i, line in enumerate(lines):
        name, separator, body = line.partition(" ::= ")
        if separator and body == _BOUNDED_STRING_CHARACTER:
            lines[i] = f"{name} ::= {_JSON_STRING_CHARACTER}"
    fixed = "\n".join(lines)
    return grammar if fixed == text else xgr.Grammar.from_ebnf(fixed)


def output_bounds_of(grammar: xgr.Grammar) -> output_bounds.OutputBounds:
    """What the grammar's rules need (grammar/xgrammar/output_bounds.py); inexact (jump-forward off,
    nothing refused) if the rules cannot be read."""
    try:
        return output_bounds.analyze(json.loads(grammar.serialize_json()), _regex_bounds)
    except (KeyError, IndexError, TypeError, ValueError) as e:
        logger.warning("grammar rules not analysed (%s: %s); jump-forward is off for this grammar",
                       type(e).__name__, e)
        return output_bounds.OutputBounds(0, 0, None, exact=False)


def check_bounds(kind: str, grammar: xgr.Grammar, max_forced_bytes: int) -> output_bounds.OutputBounds:
    """The grammar's bounds; a GrammarError for a grammar that can never end, or that needs more
    than `max_forced_bytes` of output at one point."""
    bounds = output_bounds_of(grammar)
    example = " (e.g. a required property whose schema refers back to its parent)" if kind == "json_schema" else ""
    if bounds.min_bytes == output_bounds.INFINITE:
        raise GrammarError(f"{kind} accepts no output of finite length: a required part contains itself"
                           f"{example}, so its text would be forced without end")
    if bounds.dead_rule is not None:
        raise GrammarError(f"{kind} has a part that can never end (grammar rule {bounds.dead_rule!r}: it "
                           f"contains itself{example}); output entering it would be forced without end")
    if bounds.max_required_bytes > max_forced_bytes:
        raise GrammarError(f"{kind} needs at least {bounds.max_required_bytes:.0f} bytes of output at one point, "
                           f"over this server's max_forced_bytes limit of {max_forced_bytes}; lower its repetition "
                           "counts or minimum lengths")
    return bounds


def _regex_bounds(pattern: str) -> output_bounds.OutputBounds:
    try:
        grammar = xgr.Grammar.from_regex(pattern)
    except Exception:  # reported when the grammar compiles; nothing is known here
        return output_bounds.OutputBounds(0, 0, None, exact=False)
    return output_bounds.analyze(json.loads(grammar.serialize_json()),
                                 lambda _: output_bounds.OutputBounds(0, 0, None, exact=False))


def _json_to_grammar(schema_text: str, whitespace: str) -> xgr.Grammar:
    try:
        return xgr.Grammar.from_json_schema(schema_text, strict_mode=True, **WHITESPACE_OPTIONS[whitespace])
    except Exception as e:
        raise GrammarError(f"json_schema does not compile: {strip_native_prefix(str(e))}") from None


def _findings_from_log(lines: list[str], schema: Any, known: list[Finding], whitespace: str) -> list[Finding]:
    """Turn xgrammar's warnings into findings; a warning the static check already explains
    adds nothing, and a oneOf warning is traced to the oneOf(s) that caused it."""
    out: list[Finding] = []
    known_keywords = {f.keyword for f in known}
    for line in dict.fromkeys(lines):  # de-duplicated, in order
        if _ONE_OF_WARNING in line:
            out += [Finding("oneOf", p, "branches may overlap, so it is enforced as anyOf")
                    for p in _overlapping_one_ofs(schema, whitespace)]
            continue
        keywords = warning_keywords(line)
        if not keywords & known_keywords:
            out.append(Finding(min(keywords), None, f"xgrammar: {line}"))
    return out


def _overlapping_one_ofs(schema: Any, whitespace: str) -> list[str | None]:
    """Pointers of the oneOfs xgrammar falls back to anyOf for: convert once per oneOf with
    every other oneOf renamed to anyOf, and see whether the warning comes back."""
    pointers = [p for p, node, _ in iter_subschemas(schema)
                if isinstance(node, dict) and "oneOf" in node]
    guilty: list[str | None] = []
    for pointer in pointers:
        trial = normalize(schema)
        for other, node, _ in iter_subschemas(trial):
            if isinstance(node, dict) and "oneOf" in node and other != pointer:
                node["anyOf"] = node.pop("oneOf")
        with capture_native_log() as lines:
            try:
                _json_to_grammar(json.dumps(trial), whitespace)
            except GrammarError:
                pass
        if any(_ONE_OF_WARNING in line for line in lines):
            guilty.append(pointer)
    return guilty or [None]
