"""Tool-call and think-section grammars as structural tags: plain JSON documents in xgrammar's
structural-tag format (`{"type": "structural_tag", "format": {...}}`), built without the library.

Each tool's arguments arrive as an EBNF grammar already compiled from its schema by the JSON path
(the same checks and errors as a json_schema constraint), so the tags only add the call syntax.

* required / named: only calls, from the first token: `tags_with_separator`, at least one.
* auto: free text; once the model writes the syntax's trigger the call is constrained
  (`triggered_tags`), and free text may follow it. With an answer constraint (a response_format
  beside the tools), either an answer in its grammar or only calls (`or`): xgrammar's triggered
  tags leave the text between calls free, so text and calls cannot be mixed there.
* a think section: free text (at most `budget` tokens, then the end marker is forced) up to the
  end marker, then the answer's grammar.
"""
from __future__ import annotations

from typing import Any

from grammar.chat.tool_calls import ToolCalls

Format = dict[str, Any]
# what may separate the think end marker from the answer (models write a blank line there)
_AFTER_THINK = {"type": "regex", "pattern": r"\n{0,2}"}


def tool_calls_format(spec: ToolCalls, arguments_ebnf: dict[str, str], answer_ebnf: str | None = None) -> Format:
    """The format of `spec`'s calls; `arguments_ebnf`: tool name -> its arguments' EBNF grammar.
    With `answer_ebnf` (choice auto), the output is either an answer in that grammar or calls."""
    syntax = spec.call_syntax
    tools = spec.allowed_tools
    wrapped = syntax.wrapped

    def call_tag(name: str) -> Format:
        begin = syntax.call_prefix(name)
        return {"type": "tag", "begin": begin if wrapped else syntax.open + begin,
                "content": {"type": "grammar", "grammar": arguments_ebnf[name]},
                "end": "}" if wrapped else "}" + syntax.close}

    calls = {"type": "tags_with_separator", "tags": [call_tag(t.name) for t in tools],
             "separator": syntax.separator, "at_least_one": True, "stop_after_first": not spec.parallel}
    if wrapped:  # one open ... close around every call
        calls = {"type": "tag", "begin": syntax.open, "content": calls, "end": syntax.close}
    if spec.choice != "auto":
        return calls
    if answer_ebnf is not None:  # triggered tags' free text cannot be constrained: one or the other
        return {"type": "or", "elements": [grammar_format(answer_ebnf), calls]}
    tags = [calls] if wrapped else calls["tags"]
    return {"type": "triggered_tags", "triggers": [syntax.trigger], "tags": tags,
            "stop_after_first": not spec.parallel}


def think_then(answer: Format, end_marker: str, budget: int) -> Format:
    """Free thinking up to `end_marker` (at most `budget` tokens; 0: no limit), then `answer`."""
    thinking: Format = {"type": "any_text"}
    if budget:
        thinking["max_tokens"] = budget
    think = {"type": "tag", "begin": "", "content": thinking, "end": end_marker}
    return {"type": "sequence", "elements": [think, _AFTER_THINK, answer]}


def grammar_format(ebnf: str) -> Format:
    return {"type": "grammar", "grammar": ebnf}


def structural_tag(format_: Format) -> dict[str, Any]:
    return {"type": "structural_tag", "format": format_}
