"""The service's wire-neutral GenerationRequest (service/request.py) as formwork.v1 GenerateRequests:
the inverse of service/grpc/requests.py, for a job sent to a Formwork gRPC server.

A GenerateRequest has one prompt and one choice, so an HTTP request with several prompts or n
choices becomes several, as the HTTP front end starts them (choice i's seed is seed + i). What the
gRPC API cannot carry (chat template variables other than enable_thinking, a message's
reasoning_content) is refused by name rather than dropped.
"""
from __future__ import annotations

import json
from typing import Any

from service._gen.formwork.v1 import generation_pb2 as pb
from service.errors import invalid_argument
from service.request import ConstraintRequest, GenerationRequest, PromptInput

_OPTIONAL_SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty",
                             "frequency_penalty", "presence_penalty", "ignore_eos", "include_stop_str_in_output",
                             "logprobs", "speculative", "min_tokens")
_CONSTRAINT_OPTIONS = ("strict", "any_whitespace", "jump_forward", "close_early")
_WHITESPACE = {"compact": pb.JSON_WHITESPACE_COMPACT, "spaced": pb.JSON_WHITESPACE_SPACED,
               "bounded": pb.JSON_WHITESPACE_BOUNDED, "any": pb.JSON_WHITESPACE_ANY}
_GRAMMAR_SYNTAX = {"ebnf": pb.GRAMMAR_SYNTAX_EBNF, "lark": pb.GRAMMAR_SYNTAX_LARK}
_GRAMMAR_BACKEND = {"auto": pb.GRAMMAR_BACKEND_AUTO, "xgrammar": pb.GRAMMAR_BACKEND_XGRAMMAR,
                    "llguidance": pb.GRAMMAR_BACKEND_LLGUIDANCE}
_TOOL_CHOICE = {"none": pb.TOOL_CHOICE_MODE_NONE, "auto": pb.TOOL_CHOICE_MODE_AUTO,
                "required": pb.TOOL_CHOICE_MODE_REQUIRED}


def generate_requests(request: GenerationRequest, num_choices: int) -> list[pb.GenerateRequest]:
    """One GenerateRequest per prompt and choice, in the HTTP front end's output order (prompt
    by prompt, its choices in turn). Raises ServiceError for what gRPC cannot carry."""
    if request.chat.template_kwargs:
        name = sorted(request.chat.template_kwargs)[0]
        raise invalid_argument(f"chat_template_kwargs.{name}", "cannot be sent to a gRPC server (only "
                                                               "enable_thinking can, as reasoning.enabled)")
    base = pb.GenerateRequest(priority=request.priority)
    sampling = request.sampling
    for name in _OPTIONAL_SAMPLING_FIELDS:
        value = getattr(sampling, name)
        if value is not None:
            setattr(base, name, value)
    base.stop.extend(sampling.stop)
    base.stop_token_ids.extend(sampling.stop_token_ids)
    if request.constraint is not None:
        base.constraint.CopyFrom(_constraint(request.constraint))
    chat = request.chat
    base.tools.extend(pb.Tool(name=t.name, description=t.description, parameters_json=t.parameters_json)
                      for t in chat.tools)
    if chat.tool_choice == "named":
        base.tool_choice.function_name = chat.tool_name
    elif chat.allowed_tools:
        base.tool_choice.allowed_tools.mode = _TOOL_CHOICE[chat.tool_choice]
        base.tool_choice.allowed_tools.function_names.extend(chat.allowed_tools)
    else:
        base.tool_choice.mode = _TOOL_CHOICE[chat.tool_choice]
    base.parallel_tool_calls = chat.parallel_tool_calls
    if chat.thinking is not None:
        base.reasoning.enabled = chat.thinking
    if chat.reasoning_budget is not None:
        base.reasoning.budget_tokens = chat.reasoning_budget
    if chat.grammar_backend is not None:
        if chat.grammar_backend not in _GRAMMAR_BACKEND:
            raise invalid_argument("grammar_backend", f"unknown grammar backend {chat.grammar_backend!r}")
        base.grammar_backend = _GRAMMAR_BACKEND[chat.grammar_backend]
    requests = []
    for prompt in request.prompts:
        with_prompt = pb.GenerateRequest()
        with_prompt.CopyFrom(base)
        _set_prompt(with_prompt, prompt)
        for choice in range(num_choices):
            one = pb.GenerateRequest()
            one.CopyFrom(with_prompt)
            if sampling.seed is not None and choice:  # the same seed would give n equal choices
                one.seed = sampling.seed + choice
            requests.append(one)
    return requests


def _set_prompt(request: pb.GenerateRequest, prompt: PromptInput) -> None:
    if prompt.token_ids is not None:
        request.prompt_token_ids.ids.extend(prompt.token_ids)
    elif prompt.messages is not None:
        request.chat.add_generation_prompt = prompt.add_generation_prompt
        request.chat.messages.extend(_message(m, index) for index, m in enumerate(prompt.messages))
    else:
        request.prompt = prompt.text or ""


def _message(message: dict[str, Any], index: int) -> pb.ChatMessage:
    if message.get("reasoning_content") is not None:
        raise invalid_argument(f"chat.messages[{index}].reasoning_content", "cannot be sent to a gRPC server")
    calls = [pb.ToolCall(id=call["id"], name=call["function"]["name"],
                         arguments_json=_json_text(call["function"]["arguments"]))
             for call in message.get("tool_calls") or []]
    return pb.ChatMessage(role=message["role"], content=message["content"], tool_calls=calls,
                          tool_call_id=message.get("tool_call_id", ""), name=message.get("name", ""))


def _json_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def _constraint(constraint: ConstraintRequest) -> pb.Constraint:
    message = pb.Constraint()
    # the kinds are the gRPC fields' names; a schema goes as text, which keeps its property order
    if constraint.kind in ("json_schema", "json_schema_text"):
        message.json_schema_text = constraint.spec
    elif constraint.kind == "json_object":
        message.json_object.SetInParent()
    elif constraint.kind == "choice":
        message.choice.choices.extend(constraint.choices)
    else:  # regex, grammar, structural_tag
        setattr(message, constraint.kind, constraint.spec)
    for name in _CONSTRAINT_OPTIONS:
        value = getattr(constraint, name)
        if value is not None:
            setattr(message, name, value)
    if constraint.whitespace is not None:
        message.whitespace = _WHITESPACE[constraint.whitespace]
    if constraint.grammar_syntax is not None:
        message.grammar_syntax = _GRAMMAR_SYNTAX[constraint.grammar_syntax]
    if constraint.grammar_backend is not None:
        message.grammar_backend = _GRAMMAR_BACKEND[constraint.grammar_backend]
    return message
