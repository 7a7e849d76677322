"""OpenAI request bodies -> formwork.v1 GenerateRequests, so that both front ends validate alike.

The sampling fields, the constraint and the prompt are put on a GenerateRequest and checked by
service/conversion.py, the code gRPC uses; what it reports names gRPC's fields, which
`FieldNames.rename` turns back into the HTTP request's (`constraint.json_schema_text` ->
`response_format.json_schema.schema`). What only HTTP has is checked here.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from service._gen.formwork.v1 import generation_pb2 as pb
from service.errors import FieldViolation, ServiceError, invalid_argument
from service.http.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest, _GenerationRequest

MAX_CHOICES = 16  # n, per prompt
# Formwork's JSON whitespace modes, by their HTTP names
_GRAMMAR_SYNTAX = {"ebnf": pb.GRAMMAR_SYNTAX_EBNF, "lark": pb.GRAMMAR_SYNTAX_LARK}
_TOOL_CHOICE = {"none": pb.TOOL_CHOICE_MODE_NONE, "auto": pb.TOOL_CHOICE_MODE_AUTO,
                "required": pb.TOOL_CHOICE_MODE_REQUIRED}
_WHITESPACE = {"compact": pb.JSON_WHITESPACE_COMPACT, "spaced": pb.JSON_WHITESPACE_SPACED,
               "bounded": pb.JSON_WHITESPACE_BOUNDED, "any": pb.JSON_WHITESPACE_ANY}


@dataclass
class FieldNames:
    """gRPC request field -> the HTTP field it came from, for error messages and `param`."""

    names: dict[str, str] = field(default_factory=dict)

    def rename(self, error: ServiceError) -> tuple[ServiceError, str | None]:
        """The error with its field named as the HTTP request names it, and that name."""
        if not error.violations:
            return error, None
        grpc_field = error.violations[0].field
        http_field = self._http_name(grpc_field)
        message = error.message
        if message.startswith(grpc_field):
            message = http_field + message[len(grpc_field):]
        violations = [FieldViolation(self._http_name(v.field), v.description) for v in error.violations]
        return ServiceError(error.code, message, violations), http_field

    def _http_name(self, grpc_field: str) -> str:
        for prefix in sorted(self.names, key=len, reverse=True):  # the longest match: chat.messages before chat
            if grpc_field == prefix or grpc_field.startswith((prefix + ".", prefix + "[")):
                return self.names[prefix] + grpc_field[len(prefix):]
        return grpc_field


@dataclass(frozen=True)
class Translated:
    request: pb.GenerateRequest  # sampling, stops and constraint; no input
    prompts: list[pb.GenerateRequest]  # one per prompt, input only
    field_names: FieldNames
    num_choices: int  # n: choices per prompt
    priority: int
    stream: bool
    include_usage: bool


def translate_chat(body: ChatCompletionRequest) -> Translated:
    names = FieldNames({"chat.messages": "messages", "chat": "messages", "tool_choice.function_name":
                        "tool_choice.function.name", "reasoning.budget_tokens": "formwork.reasoning_budget",
                        "reasoning.enabled": "chat_template_kwargs.enable_thinking"})
    _refuse(body.functions, "functions", "the legacy functions field is not supported; use tools")
    _refuse(body.audio, "audio", "audio output is not supported")
    if body.modalities and body.modalities != ["text"]:
        raise invalid_argument("modalities", "only text is supported")
    messages = [_chat_message(m, index) for index, m in enumerate(body.messages)]
    chat = pb.Chat(messages=messages)
    if not body.add_generation_prompt:
        chat.add_generation_prompt = False
    request = _sampling_request(body, names)
    if body.max_completion_tokens is not None:
        _set_uint(request, "max_tokens", body.max_completion_tokens, "max_completion_tokens", names)
    if body.top_logprobs is not None and not body.logprobs:
        raise invalid_argument("top_logprobs", "needs logprobs: true")
    if body.logprobs:
        _set_uint(request, "logprobs", body.top_logprobs or 0, "top_logprobs", names)
    _tools(body, request)
    return _translated(body, request, [pb.GenerateRequest(chat=chat)], names)


def _tools(body: ChatCompletionRequest, request: pb.GenerateRequest) -> None:
    """tools, tool_choice, parallel_tool_calls and the reasoning switches, as gRPC's fields."""
    for tool in body.tools or []:
        function = tool.function
        parameters = "" if function.parameters is None else json.dumps(function.parameters, ensure_ascii=False)
        request.tools.append(pb.Tool(name=function.name, description=function.description or "",
                                     parameters_json=parameters))
    choice = body.tool_choice
    if isinstance(choice, str):
        request.tool_choice.mode = _TOOL_CHOICE[choice]
    elif choice is not None:
        request.tool_choice.function_name = choice.function.name
    if body.parallel_tool_calls is not None:
        request.parallel_tool_calls = body.parallel_tool_calls
    kwargs = body.chat_template_kwargs or {}
    unknown = sorted(set(kwargs) - {"enable_thinking"})
    if unknown:
        raise invalid_argument(f"chat_template_kwargs.{unknown[0]}", "is not supported (only enable_thinking)")
    if "enable_thinking" in kwargs:
        if not isinstance(kwargs["enable_thinking"], bool):
            raise invalid_argument("chat_template_kwargs.enable_thinking", "must be true or false")
        request.reasoning.enabled = kwargs["enable_thinking"]
    budget = body.formwork.reasoning_budget if body.formwork else None
    if budget is not None:
        if not 0 <= budget < 1 << 32:
            raise invalid_argument("formwork.reasoning_budget", f"must be >= 0, got {budget}")
        request.reasoning.budget_tokens = budget


def _chat_message(message: ChatMessage, index: int) -> pb.ChatMessage:
    out = pb.ChatMessage(role=message.role, content=_message_text(message.content, index),
                         tool_call_id=message.tool_call_id or "", name=message.name or "")
    for call in message.tool_calls or []:
        arguments = call.function.arguments
        out.tool_calls.append(pb.ToolCall(id=call.id, name=call.function.name, arguments_json=arguments if isinstance(
            arguments, str) else json.dumps(arguments, ensure_ascii=False)))
    return out


def translate_completion(body: CompletionRequest) -> Translated:
    names = FieldNames({"prompt_token_ids.ids": "prompt", "prompt_token_ids": "prompt"})
    if body.echo:
        raise invalid_argument("echo", "echoing the prompt is not supported")
    _refuse(body.suffix, "suffix", "suffix (insertion) is not supported")
    request = _sampling_request(body, names)
    if body.logprobs is not None:
        _set_uint(request, "logprobs", body.logprobs, "logprobs", names)
    prompt = body.prompt
    if isinstance(prompt, str):
        prompts = [pb.GenerateRequest(prompt=prompt)]
    elif prompt and all(isinstance(p, int) for p in prompt):
        prompts = [_token_prompt(prompt, "prompt")]  # type: ignore[arg-type]
    elif not prompt:
        raise invalid_argument("prompt", "must not be empty")
    else:
        prompts = [pb.GenerateRequest(prompt=p) if isinstance(p, str) else _token_prompt(p, f"prompt[{i}]")
                   for i, p in enumerate(prompt)]  # type: ignore[union-attr]
    return _translated(body, request, prompts, names)


def _translated(body: _GenerationRequest, request: pb.GenerateRequest, prompts: list[pb.GenerateRequest],
                names: FieldNames) -> Translated:
    if not 1 <= body.n <= MAX_CHOICES:
        raise invalid_argument("n", f"must be in [1, {MAX_CHOICES}], got {body.n}")
    if body.best_of is not None and body.best_of != body.n:
        raise invalid_argument("best_of", "is not supported (only best_of == n)")
    if body.logit_bias:
        raise invalid_argument("logit_bias", "is not supported; constrain the output with response_format or "
                                             "structured_outputs instead")
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    if body.stream_options is not None and not body.stream:
        raise invalid_argument("stream_options", "is only allowed with stream: true")
    priority = body.formwork.priority if body.formwork else 0
    return Translated(request, prompts, names, body.n, priority, body.stream, include_usage)


def _sampling_request(body: _GenerationRequest, names: FieldNames) -> pb.GenerateRequest:
    request = pb.GenerateRequest()
    for name in ("temperature", "top_p", "min_p", "seed", "frequency_penalty", "presence_penalty",
                 "repetition_penalty", "ignore_eos", "include_stop_str_in_output"):
        value = getattr(body, name)
        if value is not None:
            setattr(request, name, value)
    if body.top_k is not None:
        _set_uint(request, "top_k", 0 if body.top_k == -1 else body.top_k, "top_k", names)  # vLLM: -1 disables
    if body.max_tokens is not None:
        _set_uint(request, "max_tokens", body.max_tokens, "max_tokens", names)
    if body.stop is not None:
        request.stop.extend([body.stop] if isinstance(body.stop, str) else body.stop)
    if body.stop_token_ids:
        bad = [t for t in body.stop_token_ids if t < 0]
        if bad:
            raise invalid_argument("stop_token_ids", f"ids must be >= 0; got {bad[:5]}")
        request.stop_token_ids.extend(body.stop_token_ids)
    if body.formwork is not None and body.formwork.speculative is not None:
        request.speculative = body.formwork.speculative
    constraint = _constraint(body, names)
    if constraint is not None:
        request.constraint.CopyFrom(constraint)
    return request


def _set_uint(request: pb.GenerateRequest, name: str, value: int, http_name: str, names: FieldNames) -> None:
    if value < 0:
        raise invalid_argument(http_name, f"must be >= {1 if name == 'max_tokens' else 0}, got {value}")
    if value >= 1 << 32:
        raise invalid_argument(http_name, f"{value} is out of range")
    setattr(request, name, value)
    names.names[name] = http_name


def _constraint(body: _GenerationRequest, names: FieldNames) -> pb.Constraint | None:
    """The one output constraint the request asks for, from whichever field it used."""
    found: list[tuple[str, pb.Constraint]] = []
    response_format = body.response_format
    if response_format is not None and response_format.type == "json_object":
        found.append(("response_format", pb.Constraint(json_object=pb.JsonObject())))
    elif response_format is not None and response_format.type == "json_schema":
        schema = response_format.json_schema.schema_ if response_format.json_schema else None
        if schema is None:
            raise invalid_argument("response_format.json_schema.schema", "is required with type json_schema")
        constraint = pb.Constraint(json_schema_text=json.dumps(schema, ensure_ascii=False))
        assert response_format.json_schema is not None
        if response_format.json_schema.strict is not None:
            constraint.strict = response_format.json_schema.strict
        found.append(("response_format.json_schema.schema", constraint))
    structured = body.structured_outputs
    if structured is not None:
        kinds = [k for k in ("json_", "regex", "choice", "grammar", "json_object") if getattr(structured, k) is not None]
        if len(kinds) != 1:
            raise invalid_argument("structured_outputs", "set exactly one of json, regex, choice, grammar, json_object")
        kind = kinds[0]
        found.append((f"structured_outputs.{kind.rstrip('_')}", _kind_constraint(kind, getattr(structured, kind))))
    for name, kind in (("guided_json", "json_"), ("guided_regex", "regex"), ("guided_choice", "choice"),
                       ("guided_grammar", "grammar")):
        value = getattr(body, name)
        if value is not None:
            found.append((name, _kind_constraint(kind, value)))
    if len(found) > 1:
        raise invalid_argument(found[1][0], f"only one output constraint per request; {found[0][0]} is set too")
    if not found:
        if body.formwork and any(v is not None for v in (body.formwork.strict, body.formwork.any_whitespace,
                                                        body.formwork.jump_forward, body.formwork.whitespace)):
            raise invalid_argument("formwork", "strict, whitespace, any_whitespace and jump_forward need an output "
                                               "constraint")
        if body.formwork and body.formwork.close_early is not None:
            raise invalid_argument("formwork", "close_early needs an output constraint")
        return None
    http_field, constraint = found[0]
    kind = constraint.WhichOneof("kind")
    names.names[f"constraint.{kind}"] = http_field
    names.names["constraint"] = http_field
    options = body.formwork
    if options is not None:
        for option in ("strict", "any_whitespace", "jump_forward", "close_early"):
            if getattr(options, option) is not None:
                setattr(constraint, option, getattr(options, option))
        if options.whitespace is not None:
            constraint.whitespace = _WHITESPACE[options.whitespace]
        if kind == "grammar" and options.grammar_syntax != "auto":
            constraint.grammar_syntax = _GRAMMAR_SYNTAX[options.grammar_syntax]
    return constraint


def _kind_constraint(kind: str, value: Any) -> pb.Constraint:
    if kind == "json_":
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        return pb.Constraint(json_schema_text=text)
    if kind == "json_object":
        return pb.Constraint(json_object=pb.JsonObject())
    if kind == "choice":
        return pb.Constraint(choice=pb.Choice(choices=value))
    return pb.Constraint(**{kind: value})


def _message_text(content: str | list[dict[str, Any]] | None, index: int) -> str:
    """A message's text: the string, or its text parts joined (other parts are refused)."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part_index, part in enumerate(content):
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise invalid_argument(f"messages[{index}].content[{part_index}]",
                                   f"only text parts are supported, got type {part.get('type')!r}")
        texts.append(part["text"])
    return "".join(texts)


def _token_prompt(token_ids: list[int], field: str) -> pb.GenerateRequest:
    bad = [t for t in token_ids if not 0 <= t < 1 << 32]
    if bad:
        raise invalid_argument(field, f"token ids must be in [0, 2^32); got {bad[:5]}")
    return pb.GenerateRequest(prompt_token_ids=pb.TokenIds(ids=token_ids))


def _refuse(value: object, field: str, description: str) -> None:
    if value:
        raise invalid_argument(field, description)
