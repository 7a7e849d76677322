"""Tools in a chat prompt: rendered by the model's own chat template when it knows tools, by a
Hermes-style tool prompt when it does not.

A template that reads `tools` gets them as transformers passes them (`apply_chat_template(tools=
...)`), and the conversation's assistant calls and `tool` results as they are; one that reads them
off the system message (Phi-4-mini's `message['tools']`) gets them there as JSON text, and the
earlier calls written into their assistant message, since it renders only `content`. For a template
without tools (SmolLM2's ChatML), the tools go into the system message with the call syntax the
output is constrained to, earlier calls are written into their assistant message in that syntax,
and tool results become user turns in `<tool_response>` tags, as Qwen 2.5's template writes them
(in a ```tool_output block for Gemma's ```tool_code calls, as Google's guides write them).
"""
from __future__ import annotations

import json
from typing import Any

from grammar.chat.tool_calls import CallSyntax

# call syntax name -> (before, after) a tool result in its user turn; other syntaxes: Qwen 2.5's tags
_RESULT_WRAPPING = {"tool_code": ("```tool_output\n", "\n```")}
_DEFAULT_RESULT_WRAPPING = ("<tool_response>\n", "\n</tool_response>")


def template_knows_tools(chat_template: str | None) -> bool:
    return bool(chat_template) and "tools" in chat_template  # type: ignore[operator]


def template_reads_system_tools(chat_template: str | None) -> bool:
    """Whether the template reads the tools off the system message, as JSON text (Phi-4-mini's
    writes `<|tool|>` + message['tools'] + `<|/tool|>`), rather than from a `tools` variable."""
    return bool(chat_template) and ("message['tools']" in chat_template  # type: ignore[operator]
                                    or "message.tools" in chat_template)  # type: ignore[operator]


def render_inputs(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, chat_template: str | None,
                  syntax: CallSyntax) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(the messages, the template's extra variables) that render a conversation with `tools`
    (transformers' function shape) and its earlier calls and results, for the model's template."""
    uses_tools = tools or any(m["role"] == "tool" or m.get("tool_calls") for m in messages)
    if not uses_tools:
        return messages, {}
    if template_reads_system_tools(chat_template):
        return messages_with_system_tools(messages, tools, syntax), {}
    if template_knows_tools(chat_template):
        return messages, {"tools": tools}
    return messages_with_tools(messages, tools, syntax), {}


def messages_with_system_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                               syntax: CallSyntax) -> list[dict[str, Any]]:
    """The conversation for a template that reads the tools off the system message: the tools'
    functions as a JSON list in the system message's `tools` (one is added if there is none),
    earlier calls written into their assistant message in the call syntax (the template renders
    only `content`); tool results as the template renders them."""
    out = [_with_written_calls(m, syntax) for m in messages]
    if tools:
        listed = json.dumps([tool.get("function", tool) for tool in tools], ensure_ascii=False)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "tools": listed}
        else:
            out.insert(0, {"role": "system", "content": "", "tools": listed})
    return out


def _with_written_calls(message: dict[str, Any], syntax: CallSyntax) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if message.get("role") != "assistant" or not calls:
        return message
    written = syntax.render([(c["function"]["name"], c["function"]["arguments"]) for c in calls])
    content = message.get("content") or ""
    return {"role": "assistant", "content": f"{content}\n{written}" if content else written}


def messages_with_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                        syntax: CallSyntax) -> list[dict[str, Any]]:
    """The conversation for a template without tools: tool prompt, calls and results as plain text."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role, content = message.get("role"), message.get("content") or ""
        calls = message.get("tool_calls")
        if role == "assistant" and calls:
            out.append(_with_written_calls(message, syntax))
        elif role == "tool":
            before, after = _RESULT_WRAPPING.get(syntax.name, _DEFAULT_RESULT_WRAPPING)
            out.append({"role": "user", "content": f"{before}{content}{after}"})
        else:
            out.append({k: v for k, v in message.items() if k not in ("tool_calls", "tool_call_id", "name")})
    if tools:
        prompt = tool_prompt(tools, syntax)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def tool_prompt(tools: list[dict[str, Any]], syntax: CallSyntax) -> str:
    listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    example = syntax.render([("<function-name>", {"<argument>": "<value>"})])
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{listed}\n</tools>\n\n"
            f"To call a function, write its name and arguments (a JSON object) like this:\n{example}")

