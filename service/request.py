"""What a client asks for, whichever front end it came through.

The gRPC front end (service/grpc/requests.py) and the HTTP one (service/http/conversion.py) map
their messages onto these plain structs; everything behind them (service/validation.py, the chat
format, AsyncLLM) reads only these. Unset optional fields are None, so the engine's defaults apply.
Errors name request fields by their paths in the formwork.v1 API (`constraint.regex`,
`chat.messages[1].role`): the HTTP front end renames them to the fields its request used.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PromptInput:
    """One of: text, chat messages (for the chat template), or token ids."""

    field: str  # the request field it came from: "prompt", "chat" or "prompt_token_ids"
    text: str | None = None
    messages: list[dict[str, Any]] | None = None  # as chat templates read them (template_message)
    add_generation_prompt: bool = True
    token_ids: list[int] | None = None
    tools: list[dict[str, Any]] | None = None  # for the chat template (service/chat_format.py)
    template_kwargs: dict[str, Any] | None = None  # more chat template variables (enable_thinking)


@dataclass(frozen=True)
class ConstraintRequest:
    """The output constraint as sent; service/validation.py checks it and makes the engine's."""

    kind: str  # the API's name of the field it came in: one of CONSTRAINT_FIELD_KINDS
    spec: str = ""  # schema text, regex, grammar, or a structural tag's JSON text
    choices: tuple[str, ...] = ()
    strict: bool | None = None
    any_whitespace: bool | None = None
    jump_forward: bool | None = None
    close_early: bool | None = None
    whitespace: str | None = None  # a grammar.constraint JSON whitespace mode: compact, spaced, bounded, any
    grammar_syntax: str | None = None  # "ebnf" or "lark"; None: told apart by the text
    grammar_backend: str | None = None  # "auto", "xgrammar" or "llguidance"; None: the server's default


# the think section's constraint (ChatOptions.think_constraint), as errors name it
THINK_FIELD = "reasoning.think_constraint"
# ChatOptions.constraint_in_reasoning, as errors name it
IN_REASONING_FIELD = "reasoning.constraint_in_reasoning"
# the API's constraint fields -> the engine's constraint kind
CONSTRAINT_FIELD_KINDS = {"json_schema": "json_schema", "json_schema_text": "json_schema",
                          "json_object": "json_object", "regex": "regex", "grammar": "grammar", "choice": "choice",
                          "structural_tag": "structural_tag"}


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str = ""
    parameters_json: str = ""  # its JSON Schema as JSON text; "": no parameters


@dataclass(frozen=True)
class ChatOptions:
    """What a chat request asks of the model's chat format (service/chat_format.py)."""

    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str = "auto"  # none, auto, required, or named (tool_name)
    tool_name: str = ""
    parallel_tool_calls: bool = True
    thinking: bool | None = None  # None: the model's default
    reasoning_budget: int | None = None  # most tokens of thinking; None: not asked for
    # more chat template variables, as sent (HTTP's chat_template_kwargs); enable_thinking among
    # them also sets `thinking`
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    allowed_tools: tuple[str, ...] = ()  # auto / required: the only tools that may be called (empty: all)
    think_constraint: ConstraintRequest | None = None  # the think section's own constraint; None: free thinking
    # the request's constraint covers the whole output from its first token, think section
    # included (vLLM's structured_outputs.enable_in_reasoning); False: it applies after thinking
    constraint_in_reasoning: bool = False
    # "auto", "xgrammar" or "llguidance" for every grammar the request compiles (its constraint, its
    # tools' calls, its think section's); None: the constraint's own choice, else the server's default
    grammar_backend: str | None = None


@dataclass(frozen=True)
class SamplingRequest:
    """The sampling fields a request set; None (or empty) takes the engine's default, except
    max_tokens, whose default is the server's `default_max_tokens`."""

    max_tokens: int | None = None
    min_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    ignore_eos: bool | None = None
    include_stop_str_in_output: bool | None = None
    logprobs: int | None = None  # top-n logprobs per token
    speculative: bool | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()


# SamplingRequest's floats: they must be finite
FLOAT_FIELDS = ("temperature", "top_p", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty")


@dataclass(frozen=True)
class GenerationRequest:
    """One generation call: each prompt is generated with the same sampling, constraint and chat options."""

    prompts: tuple[PromptInput, ...]  # gRPC: one; HTTP completions: one per prompt
    sampling: SamplingRequest = field(default_factory=SamplingRequest)
    constraint: ConstraintRequest | None = None
    chat: ChatOptions = field(default_factory=ChatOptions)
    priority: int = 0  # lower runs first under load

    @property
    def constraint_field(self) -> str | None:
        """The field errors about the constraint name (the compiler reports them later): the
        constraint's, or "tools" when the tools' schemas are the request's constraint."""
        if self.constraint is not None:
            return f"constraint.{self.constraint.kind}"
        return "tools" if self.chat.tools else None


def template_message(role: str, content: str, tool_calls: Sequence[tuple[str, str, str]] = (),
                     tool_call_id: str = "", name: str = "") -> dict[str, Any]:
    """A chat message as chat templates read it; `tool_calls`: (id, name, arguments as JSON text),
    the arguments as a JSON value when they parse."""
    out: dict[str, Any] = {"role": role, "content": content}
    if tool_calls:
        out["tool_calls"] = [{"id": call_id, "type": "function",
                              "function": {"name": call_name, "arguments": _json_or_text(arguments)}}
                             for call_id, call_name, arguments in tool_calls]
    if tool_call_id:
        out["tool_call_id"] = tool_call_id
    if name:
        out["name"] = name
    return out


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text) if text else {}
    except json.JSONDecodeError:
        return text
