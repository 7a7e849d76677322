"""The constraints a composite constraint is built from, each with the composite's options: the
answer beside tool calls, each tool's arguments (per leaf, in its call syntax), a structural tag's
content leaves. Both backends build their tool-call and structural-tag grammars from these."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Callable

import msgspec

from grammar.backend import GrammarError, UnsupportedError
from grammar.chat.tool_call_format import arguments_notes
from grammar.json_schema.limits import check_limits

if TYPE_CHECKING:
    from grammar.chat.tool_calls import ToolCalls
    from grammar.config import GrammarConfig
    from grammar.constraint import Constraint


def answer_constraint(constraint: Constraint, answer: dict, config: GrammarConfig) -> Constraint:
    """The constraint a text answer beside tool calls follows (ToolCalls.answer), with the tool
    constraint's options, checked like any constraint (GrammarError naming the answer)."""
    checked = msgspec.structs.replace(constraint, kind=answer["kind"], spec=answer.get("spec", ""),
                                      choices=list(answer.get("choices", [])), think_end="", think_budget=0, think=None)
    try:
        checked.validate()
        check_limits(checked, config.max_spec_bytes, config.max_schema_depth)
    except ValueError as e:
        raise GrammarError(f"the answer's {checked.kind}: {e}") from None
    return checked


def tool_arguments(spec: ToolCalls, constraint: Constraint, compile_content: Callable[[Constraint, str, str], dict],
                   not_enforced: list[str]) -> dict[str, dict]:
    """Each allowed tool's arguments format in its call syntax (allowed tool name -> format), each
    leaf (the arguments' schema, or a parameter's schema or regex) compiled by
    `compile_content(content, error_label, note_label)` as a constraint of its kind with the tool
    constraint's options; the syntax's narrowings go to `not_enforced` (UnsupportedError when
    strict and the syntax cannot enforce a keyword)."""
    arguments: dict[str, dict] = {}
    allowed = {tool.name for tool in spec.allowed_tools}
    for index, tool in enumerate(spec.tools):
        if tool.name not in allowed:
            continue
        def compile_leaf(leaf: dict, parameter: str, index: int = index, tool=tool) -> dict:
            where = f'tools[{index}] "{tool.name}" parameters' + (f'.{parameter}' if parameter else "")
            content = msgspec.structs.replace(
                constraint, kind=leaf["type"], choices=[], think_end="", think_budget=0, think=None,
                spec=leaf["pattern"] if leaf["type"] == "regex" else json.dumps(leaf["json_schema"],
                                                                                ensure_ascii=False))
            note = f'tool "{tool.name}"' + (f' parameter "{parameter}"' if parameter else "")
            return compile_content(content, where, note)
        arguments[tool.name], narrowed, unenforced = spec.call_syntax.arguments_format(tool, compile_leaf)
        try:
            not_enforced += arguments_notes(tool, index, narrowed, unenforced, constraint.strict)
        except ValueError as e:
            raise UnsupportedError(str(e)) from None
    return arguments


def content_constraint(constraint: Constraint, leaf: dict, path: str, config: GrammarConfig) -> Constraint:
    """The constraint of a structural tag's content leaf (grammar/chat/structural_tag.py: a
    json_schema, regex or grammar format at `path`), with the tag constraint's options."""
    if leaf["type"] == "json_schema":
        kind, spec, syntax = "json_schema", json.dumps(leaf["json_schema"], ensure_ascii=False), ""
    elif leaf["type"] == "regex":
        kind, spec, syntax = "regex", leaf["pattern"], ""
    else:
        kind, spec, syntax = "grammar", leaf["grammar"], leaf.get("syntax", "ebnf")
    content = msgspec.structs.replace(constraint, kind=kind, spec=spec, choices=[], grammar_syntax=syntax,
                                      think_end="", think_budget=0, think=None)
    try:
        content.validate()
    except ValueError as e:
        raise GrammarError(f"{path}: {e}") from None
    return content
