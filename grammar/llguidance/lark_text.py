"""The Lark grammars llguidance reads, written as text: literal choices, tool calls whose
arguments are JSON schemas (`%json`), and a think section before another grammar. Pure text."""
from __future__ import annotations

import json
from typing import Any

from grammar.chat.tool_calls import ToolCalls

# what may separate the think end marker from the answer (models write a blank line there)
_AFTER_THINK = r"/\n{0,2}/"


def literal(text: str) -> str:
    """`text` as a Lark string literal (JSON escapes, which llguidance's Lark reads)."""
    return json.dumps(text, ensure_ascii=False)


def choice_lark(choices: list[str]) -> str:
    return "start: " + " | ".join(literal(c) for c in choices) + "\n"


def json_lark(rule: str, schema: Any, options: dict[str, Any]) -> str:
    """A rule matching JSON of `schema`, compiled with llguidance's JSON options."""
    if isinstance(schema, dict):
        schema = {**schema, "x-guidance": options}
    elif schema is True:
        schema = {"x-guidance": options}
    return f"{rule}: %json {json.dumps(schema, ensure_ascii=False)}\n"


def tool_calls_lark(spec: ToolCalls, schemas: dict[str, Any], options: dict[str, Any]) -> str:
    """Only calls (choice required / named), at least one; `schemas`: tool name -> its
    arguments' (rewritten) schema. Choice auto is the caller's to refuse or to combine."""
    syntax = spec.call_syntax
    tools = spec.allowed_tools
    lines = []
    for index, tool in enumerate(tools):
        begin = syntax.call_prefix(tool.name) if syntax.wrapped else syntax.open + syntax.call_prefix(tool.name)
        end = "}" if syntax.wrapped else "}" + syntax.close
        lines.append(f"call_{index}: {literal(begin)} args_{index} {literal(end)}")
        lines.append(json_lark(f"args_{index}", schemas[tool.name], options).rstrip("\n"))
    call = " | ".join(f"call_{i}" for i in range(len(tools)))
    calls = f"call ({literal(syntax.separator)} call)*" if spec.parallel else "call"
    if syntax.wrapped:
        calls = f"{literal(syntax.open)} {calls} {literal(syntax.close)}"
    return "\n".join([f"calls: {calls}", f"call: {call}", *lines]) + "\n"


def think_then(answer_rule: str, end_marker: str) -> str:
    """Free thinking up to and including the first `end_marker`, then `answer_rule`. The thinking
    is one lexeme that ends at the marker (llguidance's `&` and `~`: any text with the marker
    only at its end), so the lexer never has to choose where thinking stops."""
    marker = regex_escape(end_marker)
    return (f"start: THINK {_AFTER_THINK} {answer_rule}\n"
            f"THINK: /(?s:.*){marker}/ & ~/(?s:.*{marker}.+)/\n")


def regex_escape(text: str) -> str:
    """`text` literally inside a Lark /regex/ (the slash included)."""
    out = []
    for char in text:
        if char.isalnum() or char in " _-<>=:,;'\"!@#%&~`":
            out.append(char if char not in "&~" else "\\" + char)
        elif char == "\n":
            out.append(r"\n")
        elif char == "\t":
            out.append(r"\t")
        else:
            out.append("\\" + char)
    return "".join(out)
