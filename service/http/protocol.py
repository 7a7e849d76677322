"""The OpenAI request bodies Formwork reads, as pydantic models (docs/http.md lists every field).

Types only: ranges, sizes and constraints are checked where gRPC's are (service/validation.py),
so both front ends give the same message. The request bodies keep the fields they do not declare
(`model_extra`): service/http/fields.py ignores those OpenAI documents as safe to ignore and refuses
every other one by name, so no field is silently dropped. Declared fields that would change the
answer and cannot be honoured (`functions`, `logit_bias`, `echo`, ...) are refused by
service/http/conversion.py.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Open(BaseModel):
    """A request body: undeclared fields are kept, for service/http/fields.py to judge."""

    model_config = ConfigDict(extra="allow")


class JsonSchemaFormat(_Strict):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    # type structural_tag (grammar/chat/structural_tag.py): xgrammar's `format`, or the older
    # `structures` + `triggers` that vLLM and SGLang take; checked there, field by field
    format: Any = None
    structures: Any = None
    triggers: Any = None


class StructuredOutputs(_Strict):
    """vLLM's `structured_outputs`: exactly one of these."""

    json_: dict[str, Any] | bool | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: dict[str, Any] | str | None = None  # a structural tag, inline or as JSON text
    # vLLM's switch (a server setting there): the constraint covers the whole output from its first
    # token, think section included (gRPC's reasoning.constraint_in_reasoning)
    enable_in_reasoning: bool | None = None


class FormworkOptions(_Strict):
    """Formwork's own knobs, under the request key `formwork`."""

    strict: bool | None = None  # an unsupported JSON-Schema keyword is an error (default) or reported
    any_whitespace: bool | None = None  # free whitespace between JSON tokens, as gRPC's Constraint field
    whitespace: Literal["compact", "spaced", "bounded", "any"] | None = None  # JSON whitespace mode (gRPC's)
    jump_forward: bool | None = None  # append forced text without sampling it (default: the engine's)
    close_early: bool | None = None  # close before the budget runs out / on loops (default: the engine's)
    grammar_syntax: Literal["auto", "ebnf", "lark"] = "auto"  # of a grammar constraint
    # auto, xgrammar or llguidance (checked with gRPC's Constraint.grammar_backend); None: the server's
    grammar_backend: str | None = None
    priority: int = 0  # lower runs first under load, as gRPC's `priority`
    reasoning_budget: int | None = None  # most tokens of thinking, as gRPC's reasoning.budget_tokens
    # the think section's own constraint, as gRPC's reasoning.think_constraint: response_format's
    # shape (type json_object / json_schema) or structured_outputs' (json, regex, choice, grammar, json_object)
    reasoning_format: ResponseFormat | StructuredOutputs | None = None
    speculative: bool | None = None  # drafting from the prompt on or off (default: the server's), as gRPC's


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage on every chunk


class _GenerationRequest(_Open):
    """What chat and text completions share."""

    model: str | None = None
    max_tokens: int | None = None
    min_tokens: int | None = None  # vLLM's and SGLang's
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    include_stop_str_in_output: bool | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | bool | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # SGLang's constraint fields (its clients send them as extra body): an EBNF grammar, a regex, a
    # JSON Schema as JSON text or inline
    regex: str | None = None
    ebnf: str | None = None
    json_schema: dict[str, Any] | bool | str | None = None
    formwork: FormworkOptions | None = None
    # refused when set: they would change the answer in ways the engine does not do
    logit_bias: dict[str, float] | None = None
    best_of: int | None = None


class FunctionDefinition(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | bool | None = None
    strict: bool | None = None  # accepted: the parameters' schema is always enforced


class ToolParam(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


class AllowedTool(_Strict):
    type: str  # "function": the only kind of tool Formwork has; another is refused by name
    function: FunctionName | None = None


class AllowedTools(_Strict):
    mode: Literal["auto", "required"]
    tools: list[AllowedTool]


class AllowedToolsChoice(_Strict):
    """OpenAI's: calls only of these tools, while every tool is still shown to the model."""

    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


class FunctionCall(_Strict):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallParam(_Strict):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Open):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCallParam] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None  # an earlier answer's thinking, for templates that read it (Qwen3)
    refusal: str | None = None  # OpenAI's; only null is accepted


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    tools: list[ToolParam] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's: chat template variables
    functions: list[Any] | None = None
    audio: Any = None
    modalities: list[str] | None = None


class CompletionRequest(_GenerationRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None


_UNION_TAGS = frozenset(("str", "int", "float", "bool", "none"))


def field_path(loc: tuple) -> str:
    """A pydantic error location as the request's field path: messages[0].content (without the
    union member names pydantic adds, like "str" or "list[int]")."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part not in _UNION_TAGS and "[" not in part and not part.startswith(("function-", "json-or")):
            out += f".{part}" if out else part
    return out
