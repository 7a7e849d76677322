"""A request's tool calls as a structural-tag format tree (grammar/chat/structural_tag.py's
formats), built without a grammar library: each backend compiles it as it compiles a
structural_tag constraint, with each tool's arguments (and an answer beside the calls) as a content
leaf it compiled already, from the schema, by its json_schema path.

* required / named: only calls, from the first token: `tags_with_separator`, at least one.
* auto: free text; once the model writes the syntax's trigger the call is constrained
  (`triggered_tags`), and free text may follow it. With an answer constraint (a response_format
  beside the tools), either an answer in its grammar or only calls (`or`): triggered tags leave the
  text between calls free, so text and calls cannot be mixed there.
"""
from __future__ import annotations

from typing import Any

from grammar.chat.tool_calls import ToolCalls

Format = dict[str, Any]


def tool_calls_format(spec: ToolCalls, arguments: dict[str, Format], answer: Format | None = None) -> Format:
    """The format of `spec`'s calls; `arguments`: allowed tool name -> its arguments' content
    format. With `answer` (choice auto), the output is either such an answer or calls."""
    syntax = spec.call_syntax
    wrapped = syntax.wrapped

    def call_tag(name: str) -> Format:
        begin = syntax.call_prefix(name)
        return {"type": "tag", "begin": begin if wrapped else syntax.open + begin, "content": arguments[name],
                "end": "}" if wrapped else "}" + syntax.close}

    calls: Format = {"type": "tags_with_separator", "tags": [call_tag(t.name) for t in spec.allowed_tools],
                     "separator": syntax.separator, "at_least_one": True, "stop_after_first": not spec.parallel}
    if wrapped:  # one open ... close around every call
        calls = {"type": "tag", "begin": syntax.open, "content": calls, "end": syntax.close}
    if spec.choice != "auto":
        return calls
    if answer is not None:
        return {"type": "or", "elements": [answer, calls]}
    tags = [calls] if wrapped else calls["tags"]
    return {"type": "triggered_tags", "triggers": [syntax.trigger], "tags": tags, "stop_after_first": not spec.parallel}
