"""formwork.v1 request messages -> the service's wire-neutral requests (service/request.py).

Only what is particular to protobuf is checked here (which member of a oneof is set, enum numbers
this server does not know); the rest is service/validation.py's, shared with the HTTP front end.
Unset proto3 `optional` fields stay None, so the engine's own defaults apply.
"""
from __future__ import annotations

import json
from typing import Any

from google.protobuf import struct_pb2

from service._gen.formwork.v1 import generation_pb2 as pb
from service.errors import invalid_argument
from service.request import (THINK_FIELD, ChatOptions, ConstraintRequest, GenerationRequest, PromptInput,
                             SamplingRequest, ToolSpec, template_message)

# proto3 `optional` fields of GenerateRequest, named as in SamplingRequest
_OPTIONAL_SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty",
                             "frequency_penalty", "presence_penalty", "ignore_eos", "include_stop_str_in_output",
                             "logprobs", "speculative", "min_tokens")
_CONSTRAINT_OPTIONS = ("strict", "any_whitespace", "jump_forward", "close_early")
_WHITESPACE = {pb.JSON_WHITESPACE_COMPACT: "compact", pb.JSON_WHITESPACE_SPACED: "spaced",
               pb.JSON_WHITESPACE_BOUNDED: "bounded", pb.JSON_WHITESPACE_ANY: "any"}
_GRAMMAR_SYNTAX = {pb.GRAMMAR_SYNTAX_EBNF: "ebnf", pb.GRAMMAR_SYNTAX_LARK: "lark"}
GRAMMAR_BACKEND_NAMES = {pb.GRAMMAR_BACKEND_AUTO: "auto", pb.GRAMMAR_BACKEND_XGRAMMAR: "xgrammar",
                         pb.GRAMMAR_BACKEND_LLGUIDANCE: "llguidance"}
_TOOL_CHOICE = {pb.TOOL_CHOICE_MODE_UNSPECIFIED: "auto", pb.TOOL_CHOICE_MODE_AUTO: "auto",
                pb.TOOL_CHOICE_MODE_NONE: "none", pb.TOOL_CHOICE_MODE_REQUIRED: "required"}
CONSTRAINT_FIELDS = "json_schema, json_schema_text, json_object, regex, grammar, choice, structural_tag"


def generation_request_from_proto(request: pb.GenerateRequest) -> GenerationRequest:
    sampling = SamplingRequest(
        **{name: getattr(request, name) for name in _OPTIONAL_SAMPLING_FIELDS if request.HasField(name)},
        stop=tuple(request.stop), stop_token_ids=tuple(request.stop_token_ids))
    constraint = constraint_from_proto(request.constraint) if request.HasField("constraint") else None
    return GenerationRequest((prompt_from_proto(request),), sampling, constraint, chat_options_from_proto(request),
                             request.priority)


def prompt_from_proto(request: pb.GenerateRequest | pb.TokenizeRequest) -> PromptInput:
    which = request.WhichOneof("input")
    if which is None:
        fields = "prompt or chat" if isinstance(request, pb.TokenizeRequest) else "prompt, chat or prompt_token_ids"
        raise invalid_argument("input", f"set one of {fields}")
    if which == "prompt":
        return PromptInput(field="prompt", text=request.prompt)
    if which == "chat":
        chat = request.chat
        add_generation_prompt = chat.add_generation_prompt if chat.HasField("add_generation_prompt") else True
        return PromptInput(field="chat", messages=[_message(m) for m in chat.messages],
                           add_generation_prompt=add_generation_prompt)
    return PromptInput(field="prompt_token_ids", token_ids=list(request.prompt_token_ids.ids))


def _message(message: pb.ChatMessage) -> dict[str, Any]:
    return template_message(message.role, message.content,
                            [(c.id, c.name, c.arguments_json) for c in message.tool_calls],
                            message.tool_call_id, message.name)


def constraint_from_proto(constraint: pb.Constraint, field: str = "constraint") -> ConstraintRequest:
    """`field`: the request's field of the constraint, for errors (or reasoning.think_constraint)."""
    kind = constraint.WhichOneof("kind")
    if kind is None:
        raise invalid_argument(field, f"set one of {CONSTRAINT_FIELDS}")
    spec, choices = "", ()
    if kind == "json_schema":
        # a Struct keeps no key order: sort, so the same schema always gives the same grammar
        spec = json.dumps(struct_to_python(constraint.json_schema), ensure_ascii=False, sort_keys=True)
    elif kind in ("json_schema_text", "regex", "grammar", "structural_tag"):
        spec = getattr(constraint, kind)
    elif kind == "choice":
        choices = tuple(constraint.choice.choices)
    options: dict[str, Any] = {name: getattr(constraint, name) for name in _CONSTRAINT_OPTIONS
                               if constraint.HasField(name)}
    if constraint.HasField("whitespace") and constraint.whitespace != pb.JSON_WHITESPACE_UNSPECIFIED:
        if constraint.whitespace not in _WHITESPACE:
            raise invalid_argument(f"{field}.whitespace", f"unknown value {constraint.whitespace}")
        options["whitespace"] = _WHITESPACE[constraint.whitespace]
    if constraint.HasField("grammar_syntax") and constraint.grammar_syntax != pb.GRAMMAR_SYNTAX_UNSPECIFIED:
        if constraint.grammar_syntax not in _GRAMMAR_SYNTAX:
            raise invalid_argument(f"{field}.grammar_syntax", f"unknown value {constraint.grammar_syntax}")
        options["grammar_syntax"] = _GRAMMAR_SYNTAX[constraint.grammar_syntax]
    if constraint.HasField("grammar_backend"):
        backend = _grammar_backend(constraint.grammar_backend, f"{field}.grammar_backend")
        if backend is not None:
            options["grammar_backend"] = backend
    return ConstraintRequest(kind, spec, choices, **options)


def _grammar_backend(value: int, field: str) -> str | None:
    """A GrammarBackend's name; None for UNSPECIFIED."""
    if value == pb.GRAMMAR_BACKEND_UNSPECIFIED:
        return None
    if value not in GRAMMAR_BACKEND_NAMES:
        raise invalid_argument(field, f"unknown value {value}")
    return GRAMMAR_BACKEND_NAMES[value]


def chat_options_from_proto(request: pb.GenerateRequest | pb.TokenizeRequest) -> ChatOptions:
    """The tools, tool choice and reasoning switches (a TokenizeRequest has no tool choice)."""
    tools = tuple(ToolSpec(t.name, t.description, t.parameters_json) for t in request.tools)
    choice, name, allowed = "auto", "", ()
    if isinstance(request, pb.GenerateRequest) and request.HasField("tool_choice"):
        choice, name, allowed = _tool_choice(request.tool_choice)
    parallel = True
    if isinstance(request, pb.GenerateRequest) and request.HasField("parallel_tool_calls"):
        parallel = request.parallel_tool_calls
    reasoning = request.reasoning
    thinking = reasoning.enabled if reasoning.HasField("enabled") else None
    budget = reasoning.budget_tokens if reasoning.HasField("budget_tokens") else None
    think = (constraint_from_proto(reasoning.think_constraint, THINK_FIELD)
             if reasoning.HasField("think_constraint") else None)
    backend = None
    if isinstance(request, pb.GenerateRequest) and request.HasField("grammar_backend"):
        backend = _grammar_backend(request.grammar_backend, "grammar_backend")
    return ChatOptions(tools, choice, name, parallel, thinking, budget, allowed_tools=allowed, think_constraint=think,
                       constraint_in_reasoning=reasoning.constraint_in_reasoning, grammar_backend=backend)


def _tool_choice(tool_choice: pb.ToolChoice) -> tuple[str, str, tuple[str, ...]]:
    """(choice, the named tool, the allowed tools)."""
    which = tool_choice.WhichOneof("choice")
    if which == "function_name":
        return "named", tool_choice.function_name, ()
    if which == "allowed_tools":
        allowed = tool_choice.allowed_tools
        if allowed.mode not in (pb.TOOL_CHOICE_MODE_UNSPECIFIED, pb.TOOL_CHOICE_MODE_AUTO,
                                pb.TOOL_CHOICE_MODE_REQUIRED):
            raise invalid_argument("tool_choice.allowed_tools.mode", "must be TOOL_CHOICE_MODE_AUTO or "
                                                                     "TOOL_CHOICE_MODE_REQUIRED")
        if not allowed.function_names:
            raise invalid_argument("tool_choice.allowed_tools.function_names", "must name at least one tool")
        return _TOOL_CHOICE[allowed.mode], "", tuple(allowed.function_names)
    mode = tool_choice.mode
    if mode not in _TOOL_CHOICE:
        raise invalid_argument("tool_choice.mode", f"unknown value {mode}")
    return _TOOL_CHOICE[mode], "", ()


def struct_to_python(struct: struct_pb2.Struct) -> dict[str, Any]:
    """A Struct as plain JSON values; integral numbers become ints (Struct numbers are doubles)."""
    return {key: _value_to_python(value) for key, value in struct.fields.items()}


def _value_to_python(value: struct_pb2.Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        number = value.number_value
        return int(number) if number.is_integer() and abs(number) < 2**53 else number
    if kind == "struct_value":
        return struct_to_python(value.struct_value)
    if kind == "list_value":
        return [_value_to_python(v) for v in value.list_value.values]
    if kind in ("string_value", "bool_value"):
        return getattr(value, kind)
    return None  # null_value, or unset
