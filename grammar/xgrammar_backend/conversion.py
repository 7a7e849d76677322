"""Constraint text into xgrammar grammars: its converters' errors and printed warnings made
GrammarErrors or not-enforced entries, choices as EBNF, repeat counts checked first."""
from __future__ import annotations

import logging
import re

import xgrammar as xgr

from grammar import decimal_numbers, output_bounds, regex_repeats, schema_check
from grammar.backend import GrammarError
from grammar.log_capture import capture_native_log, strip_native_prefix

logger = logging.getLogger(__name__)


def convert_spec(kind: str, strict: bool, not_enforced: list[str], convert, spec: str) -> xgr.Grammar:
    """Run one of xgrammar's spec -> Grammar converters, turning its errors into GrammarError and
    its printed warnings into an error (strict) or not_enforced entries."""
    with capture_native_log() as log_lines:
        try:
            grammar = convert(spec)
        except Exception as e:
            raise GrammarError(f"{kind} does not compile: {strip_native_prefix(str(e))}") from None
    for line in dict.fromkeys(log_lines):
        if strict:
            raise GrammarError(f"{kind} is not fully enforceable: {line}")
        not_enforced.append(f"{kind}: {line}")
    return grammar


def with_native_repeats(grammar: xgr.Grammar) -> xgr.Grammar:
    """`grammar` with its Regex terminals' large counted repeats as EBNF repetitions
    (grammar/regex_repeats.py): the same language, compiled in a fraction of the time."""
    text = str(grammar)
    rewritten = regex_repeats.with_native_repeats(text)
    if rewritten == text:
        return grammar
    try:
        return xgr.Grammar.from_ebnf(rewritten)
    except Exception as e:  # the original grammar is still right, only slower to compile
        logger.warning("repeats not made native (%s); the grammar is compiled as xgrammar wrote it",
                       strip_native_prefix(str(e)))
        return grammar


def with_decimal_numbers(grammar: xgr.Grammar, rules: dict[str, str]) -> xgr.Grammar | None:
    """`grammar` with the number rules of grammar/decimal_numbers.py in place of their markers;
    None where xgrammar wrote a marker so that it cannot be replaced."""
    if not rules:
        return grammar
    text = decimal_numbers.substitute(str(grammar), rules)
    return None if text is None else xgr.Grammar.from_ebnf(text)


def check_repeats(what: str, pattern: str, max_count: int) -> None:
    found = output_bounds.find_large_repeat(pattern, max_count)
    if found is not None:
        count, offset = found
        raise GrammarError(f"{what} has the repetition count {count} (at character {offset}), over this "
                           f"server's max_repeat_count limit of {max_count}")


def choice_ebnf(choices: list[str]) -> str:
    """An EBNF grammar matching exactly one of `choices`, each taken literally."""
    return "root ::= " + " | ".join(_ebnf_literal(c) for c in choices)


def _ebnf_literal(text: str) -> str:
    out = []
    for char in text:
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif char == "\t":
            out.append("\\t")
        elif char == "\r":
            out.append("\\r")
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


_WARNING_KEYWORDS = re.compile(
    r"\b(minLength|maxLength|multipleOf|allOf|anyOf|oneOf|pattern|format|minItems|maxItems|"
    r"minProperties|maxProperties|required|\$ref|items|prefixItems|properties)\b")


def warning_keywords(line: str) -> set[str]:
    """The keyword(s) an xgrammar warning is about, to match it with a static finding."""
    if "URI should" in line:
        return {"$ref"}
    found = set(_WARNING_KEYWORDS.findall(line))
    if "minLength/maxLength" in line:
        found = {"minLength", "maxLength"}
    return found or {"(xgrammar warning)"}


def unsupported_error(findings: list[schema_check.Finding]) -> GrammarError:
    shown = "; ".join(f.message for f in findings[:5])
    more = f" (and {len(findings) - 5} more)" if len(findings) > 5 else ""
    return GrammarError(f"{shown}{more}. Remove these keywords, or set strict=false to accept "
                        "the schema with them listed as not enforced")
