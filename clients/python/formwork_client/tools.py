"""Tools, tool choice, chat messages with calls, and reasoning, from Python values into formwork.v1.

Tools come in OpenAI's shape (`{"type": "function", "function": {"name", "description",
"parameters"}}`) or flat (`{"name", "description", "parameters"}`); `parameters` is a JSON Schema
(a dict, or its JSON text). A tool choice is "none", "auto", "required", a tool's name,
OpenAI's `{"type": "function", "function": {"name": ...}}`, or OpenAI's `{"type": "allowed_tools",
"allowed_tools": {"mode": "auto" | "required", "tools": [{"type": "function", "function": {"name":
...}}, ...]}}` (the Responses API's flat form, mode and tools beside type, too): calls only of those
tools, every tool still shown to the model.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from formwork_client._gen.formwork.v1 import generation_pb2 as pb

_MODES = {"none": pb.TOOL_CHOICE_MODE_NONE, "auto": pb.TOOL_CHOICE_MODE_AUTO,
          "required": pb.TOOL_CHOICE_MODE_REQUIRED}


def to_tool(tool: Mapping[str, Any]) -> pb.Tool:
    function = tool.get("function", tool) if tool.get("type", "function") == "function" else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise TypeError(f"a tool is {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}} or "
                        f"{{'name': ..., 'parameters': ...}}, got {tool!r}")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, str):
        parameters = json.dumps(parameters)
    return pb.Tool(name=function["name"], description=function.get("description") or "",
                   parameters_json=parameters or "")


def to_tool_choice(choice: str | Mapping[str, Any]) -> pb.ToolChoice:
    if isinstance(choice, Mapping) and choice.get("type") == "allowed_tools":
        return _allowed_tools(choice.get("allowed_tools", choice))
    if isinstance(choice, Mapping):
        name = (choice.get("function") or {}).get("name")
        if not isinstance(name, str):
            raise TypeError("a named tool choice is {'type': 'function', 'function': {'name': ...}}, "
                            f"got {choice!r}")
        return pb.ToolChoice(function_name=name)
    if choice in _MODES:
        return pb.ToolChoice(mode=_MODES[choice])
    return pb.ToolChoice(function_name=choice)


def _allowed_tools(allowed: Mapping[str, Any]) -> pb.ToolChoice:
    mode = allowed.get("mode", "auto")
    if mode not in ("auto", "required"):
        raise ValueError(f"allowed_tools mode is 'auto' or 'required', got {mode!r}")
    names = [(tool.get("function") or tool).get("name") for tool in allowed.get("tools", [])]
    if not names or not all(isinstance(name, str) for name in names):
        raise TypeError("allowed_tools needs tools, each {'type': 'function', 'function': {'name': ...}}")
    return pb.ToolChoice(allowed_tools=pb.AllowedTools(mode=_MODES[mode], function_names=names))


def to_message(message: Mapping[str, Any]) -> pb.ChatMessage:
    """A chat message; an assistant's `tool_calls` (OpenAI's shape, or ToolCall messages) and a
    tool result's `tool_call_id` / `name` are kept, so the conversation renders as the model expects."""
    out = pb.ChatMessage(role=message["role"], content=message.get("content") or "",
                         tool_call_id=message.get("tool_call_id") or "", name=message.get("name") or "")
    for call in message.get("tool_calls") or ():
        if isinstance(call, pb.ToolCall):
            out.tool_calls.append(call)
            continue
        function = call.get("function", call)
        arguments = function.get("arguments", "")
        out.tool_calls.append(pb.ToolCall(id=call.get("id") or "", name=function["name"], arguments_json=(
            arguments if isinstance(arguments, str) else json.dumps(arguments))))
    return out


def set_tools(request: pb.GenerateRequest | pb.TokenizeRequest, tools: Iterable[Mapping[str, Any]] | None,
              reasoning: bool | None, reasoning_budget: int | None) -> None:
    if tools is not None:
        request.tools.extend(to_tool(t) for t in tools)
    if reasoning is not None:
        request.reasoning.enabled = reasoning
    if reasoning_budget is not None:
        request.reasoning.budget_tokens = reasoning_budget
