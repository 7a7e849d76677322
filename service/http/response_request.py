"""OpenAI's Responses API request (`POST /v1/responses`) and its translation to the service's
wire-neutral GenerationRequest, the one chat completions map onto (service/http/conversion.py).

Nothing is stored server-side: `store` is accepted and nothing is kept, so `previous_response_id`
and `conversation` (which need a stored response) are refused by name; the client sends the whole
conversation in `input`. docs/http.md, "The Responses API", lists every field.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.errors import invalid_argument
from service.http.conversion import FieldNames, Translated, grammar_backend, reasoning_format
from service.http.fields import check_extra_fields
from service.http.protocol import FormworkOptions
from service.request import (THINK_FIELD, ChatOptions, ConstraintRequest, GenerationRequest, PromptInput,
                             SamplingRequest, ToolSpec, template_message)

_TEXT_PART_TYPES = frozenset(("input_text", "output_text", "text"))
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextFormat(_Strict):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None
    # type structural_tag: as chat's response_format (service/http/protocol.py)
    format: Any = None
    structures: Any = None
    triggers: Any = None


class TextOptions(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # refused unless unset: it changes the answer


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="allow")  # other tool types' fields: refused with the type

    type: str
    name: str = ""
    description: str | None = None
    parameters: dict[str, Any] | bool | None = None
    strict: bool | None = None  # Formwork always enforces the parameters' schema


class NamedFunction(_Strict):
    type: Literal["function"]
    name: str


class AllowedTool(_Strict):
    type: str  # "function": the only kind of tool Formwork has; another is refused by name
    name: str | None = None


class AllowedToolsChoice(_Strict):
    """The Responses API's: calls only of these tools, while every tool is still shown."""

    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[AllowedTool]


class ReasoningOptions(_Strict):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class ResponsesRequest(BaseModel):
    """The fields Formwork reads; others are judged by service/http/fields.py (kept as extra)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    text: TextOptions | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | AllowedToolsChoice | None = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None  # accepted; nothing is stored
    reasoning: ReasoningOptions | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None
    formwork: FormworkOptions | None = None
    # refused when set: they need state or features this server does not have
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None
    prompt: Any = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None


def translate_response_request(body: ResponsesRequest) -> Translated:
    """The GenerationRequest a Responses API request asks for; ServiceError names the field."""
    check_extra_fields(body.model_extra, constraint_fields="text.format")
    _refuse_unsupported(body)
    names = FieldNames({"chat.messages": "input", "chat": "input", "max_tokens": "max_output_tokens",
                        "tool_choice.function_name": "tool_choice.name",
                        "tool_choice.allowed_tools.function_names": "tool_choice.tools",
                        "tool_choice.allowed_tools.mode": "tool_choice.mode", "reasoning.budget_tokens":
                        "formwork.reasoning_budget", "constraint": "text.format",
                        "constraint.grammar_backend": "formwork.grammar_backend",
                        "grammar_backend": "formwork.grammar_backend",
                        THINK_FIELD: "formwork.reasoning_format"})
    messages = ([] if body.instructions is None else [template_message("system", body.instructions)])
    messages += input_messages(body.input)
    prompt = PromptInput(field="chat", messages=messages)
    sampling = SamplingRequest(temperature=body.temperature, top_p=body.top_p,
                               speculative=body.formwork.speculative if body.formwork else None)
    if body.max_output_tokens is not None:
        if not 1 <= body.max_output_tokens < 1 << 32:
            raise invalid_argument("max_output_tokens", f"must be >= 1, got {body.max_output_tokens}")
        sampling = dataclasses.replace(sampling, max_tokens=body.max_output_tokens)
    constraint = _constraint(body)
    if constraint is not None:
        schema_field = constraint.spec and constraint.kind != "structural_tag"
        names.names[f"constraint.{constraint.kind}"] = "text.format.schema" if schema_field else "text.format"
    request = GenerationRequest((prompt,), sampling, constraint, _chat_options(body),
                                priority=body.formwork.priority if body.formwork else 0)
    return Translated(request, names, num_choices=1, stream=body.stream, include_usage=False)


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`input` as chat messages: a string is one user message; a list holds messages, the
    model's earlier function calls (joined onto one assistant message) and their outputs (tool
    messages). Earlier reasoning items are dropped, as chat templates drop earlier thinking."""
    if isinstance(items, str):
        return [template_message("user", items)]
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message":
            role = _ROLES.get(item.get("role", ""))
            if role is None:
                raise invalid_argument(f"input[{index}].role", f"must be user, assistant, system or developer, "
                                                               f"got {item.get('role')!r}")
            messages.append(template_message(role, _text(item.get("content"), f"input[{index}].content")))
        elif kind == "function_call":
            call = (_string(item, "call_id", index), _string(item, "name", index), _string(item, "arguments", index))
            if messages and messages[-1]["role"] == "assistant" and "tool_calls" in messages[-1]:
                previous = messages.pop()
                calls = [(c["id"], c["function"]["name"], _json_text(c["function"]["arguments"]))
                         for c in previous["tool_calls"]]
                messages.append(template_message("assistant", previous["content"], [*calls, call]))
            else:
                messages.append(template_message("assistant", "", [call]))
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, f"input[{index}].output")
            messages.append(template_message("tool", text, tool_call_id=_string(item, "call_id", index)))
        elif kind != "reasoning":
            raise invalid_argument(f"input[{index}].type", f"{kind!r} is not supported (message, function_call, "
                                                           f"function_call_output and reasoning are)")
    if not messages:
        raise invalid_argument("input", "must hold at least one message")
    return messages


def _refuse_unsupported(body: ResponsesRequest) -> None:
    if body.previous_response_id is not None:
        raise invalid_argument("previous_response_id", "this server stores no responses; send the whole "
                                                       "conversation in input")
    if body.conversation is not None:
        raise invalid_argument("conversation", "this server stores no conversations; send the whole conversation "
                                               "in input")
    if body.background:
        raise invalid_argument("background", "background responses are not supported (nothing is stored)")
    if body.prompt is not None:
        raise invalid_argument("prompt", "stored prompt templates are not supported; send instructions and input")
    if body.max_tool_calls is not None:
        raise invalid_argument("max_tool_calls", "is not supported; parallel_tool_calls: false allows one call")
    if body.top_logprobs:
        raise invalid_argument("top_logprobs", "log probabilities are not supported on /v1/responses; use "
                                               "/v1/chat/completions")
    if body.truncation == "auto":
        raise invalid_argument("truncation", "only disabled: a conversation too long for the context is a 400")
    if body.include:
        raise invalid_argument("include[0]", f"{body.include[0]!r} is not supported")
    if body.text is not None and body.text.verbosity is not None:
        raise invalid_argument("text.verbosity", "is not supported")
    if body.reasoning is not None:
        for name in ("effort", "summary", "generate_summary"):
            if getattr(body.reasoning, name) is not None:
                raise invalid_argument(f"reasoning.{name}", "is not supported; formwork.reasoning_budget bounds "
                                                            "the thinking")


def _constraint(body: ResponsesRequest) -> ConstraintRequest | None:
    text_format = body.text.format if body.text is not None else None
    if text_format is None or text_format.type == "text":
        constraint = None
    elif text_format.type == "json_object":
        constraint = ConstraintRequest("json_object")
    elif text_format.type == "structural_tag":
        tag = text_format.model_dump(include={"type", "format", "structures", "triggers"}, exclude_none=True)
        constraint = ConstraintRequest("structural_tag", json.dumps(tag, ensure_ascii=False))
    else:
        if text_format.schema_ is None:
            raise invalid_argument("text.format.schema", "is required with type json_schema")
        constraint = ConstraintRequest("json_schema_text", json.dumps(text_format.schema_, ensure_ascii=False),
                                       strict=text_format.strict)
    options = body.formwork
    if options is None:
        return constraint
    chosen = {name: getattr(options, name) for name in ("strict", "any_whitespace", "jump_forward", "close_early",
                                                          "whitespace")
              if getattr(options, name) is not None}
    if chosen and constraint is None:
        raise invalid_argument("formwork", f"needs an output constraint (text.format) for {', '.join(chosen)}")
    if options.grammar_backend is not None and constraint is not None:
        chosen["grammar_backend"] = options.grammar_backend
    return None if constraint is None else dataclasses.replace(constraint, **chosen)


def _chat_options(body: ResponsesRequest) -> ChatOptions:
    tools = []
    for index, tool in enumerate(body.tools or []):
        if tool.type != "function":
            raise invalid_argument(f"tools[{index}].type", f"only function tools are supported, got {tool.type!r}")
        check_extra_fields(tool.model_extra, f"tools[{index}].", "text.format")
        if not tool.name:
            raise invalid_argument(f"tools[{index}].name", "is required")
        parameters = "" if tool.parameters is None else json.dumps(tool.parameters, ensure_ascii=False)
        tools.append(ToolSpec(tool.name, tool.description or "", parameters))
    choice, name, allowed = "auto", "", ()
    if isinstance(body.tool_choice, str):
        choice = body.tool_choice
    elif isinstance(body.tool_choice, AllowedToolsChoice):
        choice, allowed = body.tool_choice.mode, _allowed_names(body.tool_choice)
    elif body.tool_choice is not None:
        choice, name = "named", body.tool_choice.name
    budget = body.formwork.reasoning_budget if body.formwork else None
    if budget is not None and not 0 <= budget < 1 << 32:
        raise invalid_argument("formwork.reasoning_budget", f"must be >= 0, got {budget}")
    parallel = body.parallel_tool_calls if body.parallel_tool_calls is not None else True
    return ChatOptions(tuple(tools), choice, name, parallel, None, budget, allowed_tools=allowed,
                       think_constraint=reasoning_format(body.formwork), grammar_backend=grammar_backend(body.formwork))


def _allowed_names(choice: AllowedToolsChoice) -> tuple[str, ...]:
    if not choice.tools:
        raise invalid_argument("tool_choice.tools", "must name at least one tool")
    names = []
    for index, tool in enumerate(choice.tools):
        if tool.type != "function":
            raise invalid_argument(f"tool_choice.tools[{index}].type", f"only function tools are supported, got "
                                                                      f"{tool.type!r}")
        if not tool.name:
            raise invalid_argument(f"tool_choice.tools[{index}].name", "is required")
        names.append(tool.name)
    return tuple(names)


def _text(content: Any, field: str) -> str:
    """A message's text: a string, or its text parts joined (other parts are refused)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid_argument(field, "must be a string or a list of text parts")
    texts = []
    for index, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in _TEXT_PART_TYPES or not isinstance(part.get("text"),
                                                                                                    str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise invalid_argument(f"{field}[{index}]", f"only text parts are supported, got type {kind!r}")
        texts.append(part["text"])
    return "".join(texts)


def _string(item: dict[str, Any], key: str, index: int) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise invalid_argument(f"input[{index}].{key}", "must be a string")
    return value


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
