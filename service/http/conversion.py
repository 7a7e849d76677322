"""OpenAI request bodies -> the service's wire-neutral GenerationRequest (service/request.py), the
struct the gRPC front end maps its messages onto too, so that both front ends validate alike.

The shared checks (service/validation.py, the chat format) name the API's fields (formwork.v1's),
which `FieldNames.rename` turns back into the HTTP request's (`constraint.json_schema_text` ->
`response_format.json_schema.schema`). What only HTTP has is checked here.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from service.errors import FieldViolation, ServiceError, invalid_argument
from service.http.fields import check_extra_fields
from service.http.protocol import (AllowedTools, AllowedToolsChoice, ChatCompletionRequest, ChatMessage, CompletionRequest,
                                   FormworkOptions, ResponseFormat, _GenerationRequest)
from service.request import (IN_REASONING_FIELD, THINK_FIELD, ChatOptions, ConstraintRequest, GenerationRequest,
                             PromptInput, SamplingRequest, ToolSpec, template_message)

MAX_CHOICES = 16  # n, per prompt
# chat template variables a request sets through its own fields, never through chat_template_kwargs
RESERVED_TEMPLATE_VARIABLES = frozenset(("messages", "tools", "add_generation_prompt"))
_SAMPLING_FIELDS = ("temperature", "top_p", "min_p", "seed", "frequency_penalty", "presence_penalty",
                    "repetition_penalty", "ignore_eos", "include_stop_str_in_output")


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
    request: GenerationRequest
    field_names: FieldNames
    num_choices: int  # n: choices per prompt
    stream: bool
    include_usage: bool
    continuous_usage: bool = False  # usage on every chunk (vLLM's stream_options.continuous_usage_stats)


def translate_chat(body: ChatCompletionRequest) -> Translated:
    names = FieldNames({"chat.messages": "messages", "chat": "messages", "tool_choice.function_name":
                        "tool_choice.function.name", "reasoning.budget_tokens": "formwork.reasoning_budget",
                        "reasoning.enabled": "chat_template_kwargs.enable_thinking",
                        "tool_choice.allowed_tools.function_names": "tool_choice.allowed_tools.tools",
                        "tool_choice.allowed_tools.mode": "tool_choice.allowed_tools.mode",
                        THINK_FIELD: "formwork.reasoning_format",
                        IN_REASONING_FIELD: "structured_outputs.enable_in_reasoning"})
    _refuse(body.functions, "functions", "the legacy functions field is not supported; use tools")
    _refuse(body.audio, "audio", "audio output is not supported")
    if body.modalities and body.modalities != ["text"]:
        raise invalid_argument("modalities", "only text is supported")
    messages = [_chat_message(m, index) for index, m in enumerate(body.messages)]
    prompt = PromptInput(field="chat", messages=messages, add_generation_prompt=body.add_generation_prompt)
    sampling, constraint = _sampling(body, names), _constraint(body, names)
    if body.max_completion_tokens is not None:
        sampling = _with_uint(sampling, "max_tokens", body.max_completion_tokens, "max_completion_tokens", names)
    if body.top_logprobs is not None and not body.logprobs:
        raise invalid_argument("top_logprobs", "needs logprobs: true")
    if body.logprobs:
        sampling = _with_uint(sampling, "logprobs", body.top_logprobs or 0, "top_logprobs", names)
    return _translated(body, GenerationRequest((prompt,), sampling, constraint, _chat_options(body)), names)


def _chat_options(body: ChatCompletionRequest) -> ChatOptions:
    """tools, tool_choice, parallel_tool_calls and the reasoning switches."""
    tools = tuple(ToolSpec(t.function.name, t.function.description or "",
                           "" if t.function.parameters is None else json.dumps(t.function.parameters,
                                                                                ensure_ascii=False))
                  for t in body.tools or [])
    choice, name, allowed = "auto", "", ()
    if isinstance(body.tool_choice, str):
        choice = body.tool_choice
    elif isinstance(body.tool_choice, AllowedToolsChoice):
        choice, allowed = body.tool_choice.allowed_tools.mode, _allowed_names(body.tool_choice.allowed_tools)
    elif body.tool_choice is not None:
        choice, name = "named", body.tool_choice.function.name
    kwargs = body.chat_template_kwargs or {}
    reserved = sorted(set(kwargs) & RESERVED_TEMPLATE_VARIABLES)
    if reserved:
        raise invalid_argument(f"chat_template_kwargs.{reserved[0]}", f"is set by the request's own "
                                                                      f"{reserved[0]} field, not here")
    thinking = kwargs.get("enable_thinking")
    if "enable_thinking" in kwargs and not isinstance(thinking, bool):
        raise invalid_argument("chat_template_kwargs.enable_thinking", "must be true or false")
    budget = body.formwork.reasoning_budget if body.formwork else None
    if budget is not None and not 0 <= budget < 1 << 32:
        raise invalid_argument("formwork.reasoning_budget", f"must be >= 0, got {budget}")
    parallel = body.parallel_tool_calls if body.parallel_tool_calls is not None else True
    return ChatOptions(tools, choice, name, parallel, thinking, budget, template_kwargs=dict(kwargs),
                       allowed_tools=allowed, think_constraint=reasoning_format(body.formwork),
                       constraint_in_reasoning=_in_reasoning(body), grammar_backend=grammar_backend(body.formwork))


def _in_reasoning(body: _GenerationRequest) -> bool:
    """vLLM's structured_outputs.enable_in_reasoning: the constraint covers the whole output."""
    return bool(body.structured_outputs and body.structured_outputs.enable_in_reasoning)


def grammar_backend(options: FormworkOptions | None) -> str | None:
    """formwork.grammar_backend, for every grammar the request compiles (ChatOptions.grammar_backend)."""
    return options.grammar_backend if options else None


def reasoning_format(options: FormworkOptions | None) -> ConstraintRequest | None:
    """formwork.reasoning_format as the think section's constraint (None: free thinking)."""
    value = options.reasoning_format if options else None
    if value is None:
        return None
    where = "formwork.reasoning_format"
    if isinstance(value, ResponseFormat):
        if value.type == "text":
            return None
        if value.type == "json_object":
            return ConstraintRequest("json_object")
        if value.type == "json_schema":
            schema = value.json_schema.schema_ if value.json_schema else None
            if schema is None:
                raise invalid_argument(f"{where}.json_schema.schema", "is required with type json_schema")
            return ConstraintRequest("json_schema_text", json.dumps(schema, ensure_ascii=False),
                                     strict=value.json_schema.strict if value.json_schema else None)
        raise invalid_argument(f"{where}.type", f"{value.type} is not a think section's format; use json_object, "
                                                "json_schema, or structured_outputs' json, regex, choice, grammar")
    if value.enable_in_reasoning:
        raise invalid_argument(f"{where}.enable_in_reasoning", "is not a think section's option; send "
                                                              "structured_outputs.enable_in_reasoning to constrain "
                                                              "the whole output, think section included")
    kinds = [k for k in ("json_", "regex", "choice", "grammar", "json_object") if getattr(value, k) is not None]
    if value.structural_tag is not None:
        raise invalid_argument(f"{where}.structural_tag", "is not a think section's format")
    if len(kinds) != 1:
        raise invalid_argument(where, "set exactly one of type (json_object, json_schema) or json, regex, choice, "
                                      "grammar, json_object")
    return _kind_constraint(kinds[0], getattr(value, kinds[0]))


def _allowed_names(allowed: AllowedTools) -> tuple[str, ...]:
    """The function names of OpenAI's allowed_tools (the check that each is a tool of the request
    is the shared one, service/chat_format.py)."""
    if not allowed.tools:
        raise invalid_argument("tool_choice.allowed_tools.tools", "must name at least one tool")
    names = []
    for index, tool in enumerate(allowed.tools):
        where = f"tool_choice.allowed_tools.tools[{index}]"
        if tool.type != "function":
            raise invalid_argument(f"{where}.type", f"only function tools are supported, got {tool.type!r}")
        if tool.function is None:
            raise invalid_argument(f"{where}.function", "is required")
        names.append(tool.function.name)
    return tuple(names)


def _chat_message(message: ChatMessage, index: int) -> dict[str, Any]:
    check_extra_fields(message.model_extra, f"messages[{index}].")
    if message.refusal is not None:
        raise invalid_argument(f"messages[{index}].refusal", "is not supported; send the text as content")
    calls = [(call.id, call.function.name, _json_text(call.function.arguments)) for call in message.tool_calls or []]
    out = template_message(message.role, _message_text(message.content, index), calls, message.tool_call_id or "",
                           message.name or "")
    if message.reasoning_content is not None:
        out["reasoning_content"] = message.reasoning_content
    return out


def translate_completion(body: CompletionRequest) -> Translated:
    names = FieldNames({"prompt_token_ids.ids": "prompt", "prompt_token_ids": "prompt"})
    if body.echo:
        raise invalid_argument("echo", "echoing the prompt is not supported")
    _refuse(body.suffix, "suffix", "suffix (insertion) is not supported")
    sampling, constraint = _sampling(body, names), _constraint(body, names)
    if body.logprobs is not None:
        sampling = _with_uint(sampling, "logprobs", body.logprobs, "logprobs", names)
    prompt = body.prompt
    if isinstance(prompt, str):
        prompts = [PromptInput(field="prompt", text=prompt)]
    elif prompt and all(isinstance(p, int) for p in prompt):
        prompts = [_token_prompt(prompt, "prompt")]  # type: ignore[arg-type]
    elif not prompt:
        raise invalid_argument("prompt", "must not be empty")
    else:
        prompts = [PromptInput(field="prompt", text=p) if isinstance(p, str) else _token_prompt(p, f"prompt[{i}]")
                   for i, p in enumerate(prompt)]  # type: ignore[union-attr]
    names.names[IN_REASONING_FIELD] = "structured_outputs.enable_in_reasoning"
    chat = ChatOptions(constraint_in_reasoning=_in_reasoning(body), grammar_backend=grammar_backend(body.formwork))
    return _translated(body, GenerationRequest(tuple(prompts), sampling, constraint, chat), names)


def _translated(body: _GenerationRequest, request: GenerationRequest, names: FieldNames) -> Translated:
    check_extra_fields(body.model_extra)
    if not 1 <= body.n <= MAX_CHOICES:
        raise invalid_argument("n", f"must be in [1, {MAX_CHOICES}], got {body.n}")
    if body.best_of is not None and body.best_of != body.n:
        raise invalid_argument("best_of", "is not supported (only best_of == n)")
    if body.logit_bias:
        raise invalid_argument("logit_bias", "is not supported; constrain the output with response_format or "
                                             "structured_outputs instead")
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    continuous_usage = bool(body.stream_options and body.stream_options.continuous_usage_stats)
    if body.stream_options is not None and not body.stream:
        raise invalid_argument("stream_options", "is only allowed with stream: true")
    priority = body.formwork.priority if body.formwork else 0
    names.names["grammar_backend"] = "formwork.grammar_backend"
    return Translated(dataclasses.replace(request, priority=priority), names, body.n, body.stream, include_usage,
                      continuous_usage)


def _sampling(body: _GenerationRequest, names: FieldNames) -> SamplingRequest:
    sampling = SamplingRequest(**{name: getattr(body, name) for name in _SAMPLING_FIELDS
                                  if getattr(body, name) is not None})
    if body.top_k is not None:  # vLLM: -1 disables
        sampling = _with_uint(sampling, "top_k", 0 if body.top_k == -1 else body.top_k, "top_k", names)
    if body.max_tokens is not None:
        sampling = _with_uint(sampling, "max_tokens", body.max_tokens, "max_tokens", names)
    if body.min_tokens is not None:
        sampling = _with_uint(sampling, "min_tokens", body.min_tokens, "min_tokens", names)
    if body.stop is not None:
        sampling = dataclasses.replace(sampling, stop=(body.stop,) if isinstance(body.stop, str) else tuple(body.stop))
    if body.stop_token_ids:
        bad = [t for t in body.stop_token_ids if t < 0]
        if bad:
            raise invalid_argument("stop_token_ids", f"ids must be >= 0; got {bad[:5]}")
        sampling = dataclasses.replace(sampling, stop_token_ids=tuple(body.stop_token_ids))
    if body.formwork is not None and body.formwork.speculative is not None:
        sampling = dataclasses.replace(sampling, speculative=body.formwork.speculative)
    return sampling


def _with_uint(sampling: SamplingRequest, name: str, value: int, http_name: str, names: FieldNames) -> SamplingRequest:
    """`sampling` with `name` set, in the range the API's unsigned 32-bit fields take."""
    if value < 0:
        raise invalid_argument(http_name, f"must be >= {1 if name == 'max_tokens' else 0}, got {value}")
    if value >= 1 << 32:
        raise invalid_argument(http_name, f"{value} is out of range")
    names.names[name] = http_name
    return dataclasses.replace(sampling, **{name: value})


def _constraint(body: _GenerationRequest, names: FieldNames) -> ConstraintRequest | None:
    """The one output constraint the request asks for, from whichever field it used."""
    found: list[tuple[str, ConstraintRequest]] = []
    response_format = body.response_format
    if response_format is not None and response_format.type == "json_object":
        found.append(("response_format", ConstraintRequest("json_object")))
    elif response_format is not None and response_format.type == "json_schema":
        schema = response_format.json_schema.schema_ if response_format.json_schema else None
        if schema is None:
            raise invalid_argument("response_format.json_schema.schema", "is required with type json_schema")
        assert response_format.json_schema is not None
        found.append(("response_format.json_schema.schema",
                      ConstraintRequest("json_schema_text", json.dumps(schema, ensure_ascii=False),
                                        strict=response_format.json_schema.strict)))
    elif response_format is not None and response_format.type == "structural_tag":
        tag = response_format.model_dump(include={"type", "format", "structures", "triggers"}, exclude_none=True)
        found.append(("response_format", ConstraintRequest("structural_tag", json.dumps(tag, ensure_ascii=False))))
    if response_format is not None and response_format.type != "structural_tag":
        extra = [n for n in ("format", "structures", "triggers") if getattr(response_format, n) is not None]
        if extra:
            raise invalid_argument(f"response_format.{extra[0]}", "belongs to type structural_tag")
    structured = body.structured_outputs
    if structured is not None:
        kinds = [k for k in ("json_", "regex", "choice", "grammar", "json_object", "structural_tag")
                 if getattr(structured, k) is not None]
        if len(kinds) != 1:
            raise invalid_argument("structured_outputs", "set exactly one of json, regex, choice, grammar, "
                                                         "json_object, structural_tag")
        kind = kinds[0]
        found.append((f"structured_outputs.{kind.rstrip('_')}", _kind_constraint(kind, getattr(structured, kind))))
    for name, kind in (("guided_json", "json_"), ("guided_regex", "regex"), ("guided_choice", "choice"),
                       ("guided_grammar", "grammar"), ("regex", "regex"), ("json_schema", "json_")):
        value = getattr(body, name)
        if value is not None:
            found.append((name, _kind_constraint(kind, value)))
    if body.ebnf is not None:  # SGLang's grammars are EBNF (xgrammar's dialect), never Lark
        found.append(("ebnf", ConstraintRequest("grammar", body.ebnf, grammar_syntax="ebnf")))
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
    names.names[f"constraint.{constraint.kind}"] = http_field
    names.names["constraint"] = http_field
    names.names["constraint.grammar_backend"] = "formwork.grammar_backend"
    options = body.formwork
    if options is None:
        return constraint
    chosen = {option: getattr(options, option) for option in ("strict", "any_whitespace", "jump_forward",
                                                               "close_early", "whitespace", "grammar_backend")
              if getattr(options, option) is not None}
    if constraint.kind == "grammar" and options.grammar_syntax != "auto":
        chosen["grammar_syntax"] = options.grammar_syntax
    return dataclasses.replace(constraint, **chosen)


def _json_text(value: Any) -> str:
    """A JSON value sent as text or inline, as text."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _kind_constraint(kind: str, value: Any) -> ConstraintRequest:
    if kind == "json_":
        return ConstraintRequest("json_schema_text", _json_text(value))
    if kind == "json_object":
        return ConstraintRequest("json_object")
    if kind == "choice":
        return ConstraintRequest("choice", choices=tuple(value))
    if kind == "structural_tag":
        return ConstraintRequest("structural_tag", _json_text(value))
    return ConstraintRequest(kind, value)


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


def _token_prompt(token_ids: list[int], field: str) -> PromptInput:
    bad = [t for t in token_ids if not 0 <= t < 1 << 32]
    if bad:
        raise invalid_argument(field, f"token ids must be in [0, 2^32); got {bad[:5]}")
    return PromptInput(field="prompt_token_ids", token_ids=list(token_ids))


def _refuse(value: object, field: str, description: str) -> None:
    if value:
        raise invalid_argument(field, description)
