"""Constraint text into xgrammar grammars: its converters' errors and printed warnings made
GrammarErrors or not-enforced entries, choices as EBNF, repeat counts checked first."""
from __future__ import annotations

import re

import xgrammar as xgr

from grammar.backend import GrammarError, UnsupportedError
from grammar.regex.repeat_counts import find_large_repeat
from grammar.xgrammar import decimal_numbers
from grammar.xgrammar.log_capture import capture_native_log, strip_native_prefix
from grammar.xgrammar.schema_gaps import Finding


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


# A grammar of this many rules builds its token masks when a matcher first needs them: xgrammar
# computes one per rule position, and an object with declared properties beside open
# additionalProperties writes a rule per node of a trie of the names (sp_0: 5,590 rules, 17 s
# eager, 0.2 s lazy). So does one whose Regex terminal repeats a group many times: xgrammar's
# automaton holds a copy of the group per count (`(?:\S+\s+){0,99}`: 2.1 s eager, 0.01 s lazy).
# Measured, the price is each state's first fill (10-50 ms, at most 0.8 s for sp_0's largest),
# once per compiled grammar; smaller grammars compile eagerly, so their fills stay microseconds.
# (Written as an EBNF repetition instead, that pattern compiled in 15 ms but every fill took
# 25-40 ms, against 0.04 ms.)
LAZY_MIN_RULES = 256
LAZY_MIN_GROUP_COUNT = 8
_REGEX_TERMINAL = re.compile(r'Regex\("((?:[^"\\]|\\.)*)"')
_GROUP_COUNT = re.compile(r"\)\{(\d+)(?:,\s*(\d*))?\}")


def builds_masks_lazily(grammar_text: str) -> bool:
    """Whether a grammar (xgrammar's printing of it) is compiled with its token masks built on
    first use rather than all at once (see LAZY_MIN_RULES)."""
    if grammar_text.count(" ::= ") >= LAZY_MIN_RULES:
        return True
    for terminal in _REGEX_TERMINAL.finditer(grammar_text):
        for count in _GROUP_COUNT.finditer(terminal.group(1)):
            if any(len(d) > 6 or int(d) >= LAZY_MIN_GROUP_COUNT for d in count.groups() if d):
                return True
    return False


def with_decimal_numbers(grammar: xgr.Grammar, rules: dict[str, str]) -> xgr.Grammar | None:
    """`grammar` with the number rules of grammar/xgrammar/decimal_numbers.py in place of their markers;
    None where xgrammar wrote a marker so that it cannot be replaced."""
    if not rules:
        return grammar
    text = decimal_numbers.substitute(str(grammar), rules)
    return None if text is None else xgr.Grammar.from_ebnf(text)


def check_repeats(what: str, pattern: str, max_count: int) -> None:
    found = find_large_repeat(pattern, max_count)
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


def unsupported_error(findings: list[Finding]) -> UnsupportedError:
    shown = "; ".join(f.message for f in findings[:5])
    more = f" (and {len(findings) - 5} more)" if len(findings) > 5 else ""
    return UnsupportedError(f"{shown}{more}. Remove these keywords, or set strict=false to accept "
                        "the schema with them listed as not enforced")
