"""Words a constraint's output may need to get out of a loop, for the closing search.

The closing search (grammar/runtime/closing_search.py) finds a closing a character at a time; where the
way out is a particular word it needs these: the ways to finish each regex the constraint holds
(a JSON-Schema `pattern`, as the escaped end of a JSON string with its closing quote; a regex
constraint's own pattern), the ways to finish a short value of a string `format` that the
search cannot spell a character at a time, a grammar's quoted literals, and a think section's
end marker (and its own constraint's words). Each
hint is only a candidate: the matcher decides where, if anywhere, it fits. Library-free.
"""
from __future__ import annotations

import json
import re
from typing import Any

from grammar.chat.structural_tag import iter_contents, parse_structural_tag, tag_ends
from grammar.chat.tool_calls import ToolCalls
from grammar.constraint import Constraint
from grammar.json_schema.walk import iter_subschemas
from grammar.regex.suffixes import regex_suffixes

MAX_HINTS = 256  # over all of a constraint's patterns, shortest first
# a short value of each string format whose closing the character search did not find (measured
# from `"` and from `"a`: an email needs its `@` and a domain, an IPv6 address its `::`); the
# other formats xgrammar enforces close without help
FORMAT_EXAMPLES = {"email": "a@a", "ipv6": "::"}
# a double-quoted literal of an EBNF or Lark grammar
_LITERAL = re.compile(r'"((?:[^"\\\n]|\\.)+)"')


def closing_hints(constraint: Constraint) -> list[str]:
    """The constraint's hints, shortest first; [] when it holds no word the search would need."""
    hints: list[str] = []
    if constraint.kind == "regex":
        hints += regex_suffixes(constraint.spec)
    elif constraint.kind == "grammar":
        hints += [_unescaped(literal) for literal in _LITERAL.findall(constraint.spec)]
    elif constraint.kind == "json_schema":
        hints += _schema_hints(_parsed(constraint.spec))
    elif constraint.kind == "tool_calls":
        try:
            spec = ToolCalls.from_spec(constraint.spec)
        except ValueError:
            spec = None
        for tool in spec.allowed_tools if spec else ():
            hints += _schema_hints(tool.schema) + spec.call_syntax.closing_words(tool)
            hints += [suffix for pattern in spec.call_syntax.raw_patterns(tool) for suffix in regex_suffixes(pattern)]
        if spec and spec.answer and spec.answer.get("kind") == "structural_tag":  # its tags join the calls'
            hints += _structural_tag_hints(spec.answer.get("spec", ""))
    elif constraint.kind == "structural_tag":
        hints += _structural_tag_hints(constraint.spec)
    if constraint.think is not None:  # its own words, to finish a constrained think section
        hints += closing_hints(constraint.think)
    if constraint.think_end:
        hints.append(constraint.think_end)
    return sorted(dict.fromkeys(hints), key=len)[:MAX_HINTS]


def _structural_tag_hints(spec: str) -> list[str]:
    """Its tags' end strings, and the hints of the schemas, regexes and grammars inside it."""
    try:
        format_ = parse_structural_tag(spec)
    except ValueError:
        return []
    hints = tag_ends(format_)
    for _, leaf in iter_contents(format_):
        if leaf["type"] == "json_schema":
            hints += _schema_hints(leaf["json_schema"])
        elif leaf["type"] == "regex":
            hints += regex_suffixes(leaf["pattern"])
        else:
            hints += [_unescaped(literal) for literal in _LITERAL.findall(leaf["grammar"])]
    return hints


def _unescaped(literal: str) -> str:
    try:  # both syntaxes escape as JSON does, for what a closing needs
        return json.loads(f'"{literal}"')
    except ValueError:
        return literal


def _parsed(spec: str) -> Any:
    try:
        return json.loads(spec)
    except (ValueError, RecursionError):
        return None


def _schema_hints(schema: Any) -> list[str]:
    """The end of each `pattern` string, and of each FORMAT_EXAMPLES value, as JSON text: escaped,
    then the closing quote."""
    hints: list[str] = []
    for _, node, _ in iter_subschemas(schema):
        if not isinstance(node, dict):
            continue
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            hints += [json.dumps(suffix, ensure_ascii=False)[1:-1] + '"' for suffix in regex_suffixes(pattern)]
        fmt = node.get("format")
        example = FORMAT_EXAMPLES.get(fmt) if isinstance(fmt, str) else None
        if example is not None:
            hints += [example[i:] + '"' for i in range(len(example))]
    return hints
