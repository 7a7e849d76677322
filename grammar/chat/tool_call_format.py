"""A request's tool calls as a structural-tag format tree (grammar/chat/structural_tag.py's
formats), built without a grammar library: each backend compiles it as it compiles a
structural_tag constraint, with each tool's arguments (and an answer beside the calls) as a content
leaf it compiled already, from the schema, by its json_schema path.

* required / named: only calls, from the first token: `tags_with_separator`, at least one.
* auto: free text; once the model writes the syntax's trigger the call is constrained
  (`triggered_tags`), and free text may follow it. With an answer constraint (a response_format
  beside the tools), either an answer in its grammar or only calls (`or`): triggered tags leave the
  text between calls free, so text and calls cannot be mixed there. A structural tag's own
  triggered tags are the exception: its triggers and tags and the calls' join in one
  `triggered_tags`, so free text may hold either (`with_tags`).
"""
from __future__ import annotations

from typing import Any

from grammar.chat.tool_calls import Tool, ToolCalls

Format = dict[str, Any]


def tool_calls_format(spec: ToolCalls, arguments: dict[str, Format], answer: Format | None = None) -> Format:
    """The format of `spec`'s calls; `arguments`: allowed tool name -> its arguments' format (the
    syntax's arguments_format, compiled). With `answer` (choice auto), the output is either such
    an answer or calls."""
    syntax = spec.call_syntax
    wrapped = syntax.wrapped
    calls: Format = {"type": "tags_with_separator",
                     "tags": [syntax.call_tag(t.name, arguments[t.name]) for t in spec.allowed_tools],
                     "separator": syntax.separator, "at_least_one": True, "stop_after_first": not spec.parallel}
    if wrapped:  # one open ... close around every call
        calls = {"type": "tag", "begin": syntax.open, "content": calls, "end": syntax.close}
    if spec.choice != "auto":
        return calls
    tags = [calls] if wrapped else calls["tags"]
    if answer is not None and answer["type"] == "triggered_tags":
        return with_tags(answer, syntax.trigger, tags, spec.parallel)
    if answer is not None:
        return {"type": "or", "elements": [answer, calls]}
    return {"type": "triggered_tags", "triggers": [syntax.trigger], "tags": tags, "stop_after_first": not spec.parallel}


def with_tags(tagged: Format, trigger: str, call_tags: list[Format], parallel: bool) -> Format:
    """A structural tag's `triggered_tags` format with the calls' trigger and tags added: free
    text may hold its tags and calls alike. Without `parallel`, the output stops after its first
    tag of either kind (one triggered_tags cannot count the calls apart)."""
    merged = dict(tagged)
    merged["triggers"] = [*tagged["triggers"], trigger]
    merged["tags"] = [*tagged["tags"], *call_tags]
    if not parallel:
        merged["stop_after_first"] = True
    return merged


def arguments_notes(tool: Tool, index: int, narrowed: list[str], unenforced: list[str], strict: bool) -> list[str]:
    """The not-enforced notes of one tool's arguments in its syntax (arguments_format's narrowings
    and unenforced keywords). With `strict`, an unenforced keyword is a ValueError naming the tool,
    as an unsupported keyword of a json_schema constraint is."""
    if strict and unenforced:
        raise ValueError(f'tools[{index}] "{tool.name}" parameters: {unenforced[0]}, not enforced by the '
                         "call syntax's parameter form (strict)")
    return [f'tool "{tool.name}": {note}' for note in narrowed + unenforced]
