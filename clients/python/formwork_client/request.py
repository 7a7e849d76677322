"""formwork.v1 requests from Python values, and the extract() recipe; shared by Client and AsyncClient.

Sampling fields left as None are not set in the request (proto3 `optional`), so the server's
defaults apply: max_tokens = the server's default_max_tokens, temperature 1.0, and so on
(docs/api.md lists them).
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from formwork_client._gen.formwork.v1 import generation_pb2 as pb
from formwork_client.constraints import GRAMMAR_BACKENDS, ConstraintLike, json_schema, to_constraint
from formwork_client.errors import IncompleteOutputError
from formwork_client.tools import set_tools, to_message, to_tool_choice

DEFAULT_ADDRESS = "127.0.0.1:50051"  # what `make serve` listens on

# [{"role": "user", "content": "..."}, ...]; an assistant's "tool_calls", a tool result's "tool_call_id"
Messages = Sequence[Mapping[str, Any]]


def generate_request(prompt: str | pb.GenerateRequest | None = None, *, messages: Messages | None = None,
                     prompt_token_ids: Sequence[int] | None = None, add_generation_prompt: bool | None = None,
                     constraint: ConstraintLike | None = None, max_tokens: int | None = None,
                     min_tokens: int | None = None, temperature: float | None = None, top_p: float | None = None,
                     top_k: int | None = None, min_p: float | None = None, seed: int | None = None, repetition_penalty: float | None = None,
                     frequency_penalty: float | None = None, presence_penalty: float | None = None,
                     stop: Iterable[str] = (), stop_token_ids: Iterable[int] = (), ignore_eos: bool | None = None,
                     include_stop_str_in_output: bool | None = None, logprobs: int | None = None,
                     priority: int = 0, request_id: str = "", tools: Iterable[Mapping[str, Any]] | None = None,
                     tool_choice: str | Mapping[str, Any] | None = None, parallel_tool_calls: bool | None = None,
                     reasoning: bool | None = None, reasoning_budget: int | None = None,
                     reasoning_format: ConstraintLike | None = None, constraint_in_reasoning: bool = False,
                     speculative: bool | None = None, grammar_backend: str | None = None) -> pb.GenerateRequest:
    """A GenerateRequest. The input is exactly one of `prompt` (raw text, tokenized as is),
    `messages` (a chat, rendered with the model's chat template) or `prompt_token_ids`; a ready
    GenerateRequest passed as `prompt` is used as it is. A dict `constraint` is a JSON Schema.
    `tools`, `tool_choice` (formwork_client.tools says their shapes), `parallel_tool_calls`:
    the calls the model may make; `reasoning` (on/off) and `reasoning_budget` (tokens): its think
    section; `reasoning_format` (a constraint, as `constraint` takes it): the think text's own
    shape (reasoning.think_constraint); `constraint_in_reasoning`: `constraint` covers the whole
    output from its first token, think section included. The response's `tool_calls`, `content`
    and `reasoning` hold the answer read back.
    `speculative`: drafting from the prompt on or off for this request (None: the server's
    default); the output is the same either way, only faster or slower (usage.draft_tokens).
    `min_tokens`: EOS, stop tokens and stop strings cannot end the output before this many tokens.
    `grammar_backend` ("auto", "xgrammar", "llguidance"): the library for every grammar the request
    compiles, its tools' calls and think section included (None: the constraint's own, else the server's)."""
    if isinstance(prompt, pb.GenerateRequest):
        return prompt
    request = pb.GenerateRequest(request_id=request_id, priority=priority, stop=list(stop),
                                 stop_token_ids=list(stop_token_ids))
    _set_input(request, prompt, messages, prompt_token_ids, add_generation_prompt)
    # proto3 `optional` fields: set only what the caller gave, so the server's defaults apply otherwise
    optional = {"max_tokens": max_tokens, "min_tokens": min_tokens, "temperature": temperature, "top_p": top_p,
                "top_k": top_k, "min_p": min_p, "seed": seed, "repetition_penalty": repetition_penalty, "frequency_penalty": frequency_penalty,
                "presence_penalty": presence_penalty, "ignore_eos": ignore_eos,
                "include_stop_str_in_output": include_stop_str_in_output, "logprobs": logprobs,
                "speculative": speculative}
    for name, value in optional.items():
        if value is not None:
            setattr(request, name, value)
    if constraint is not None:
        request.constraint.CopyFrom(to_constraint(constraint))
    set_tools(request, tools, reasoning, reasoning_budget)
    if reasoning_format is not None:
        request.reasoning.think_constraint.CopyFrom(to_constraint(reasoning_format))
    if constraint_in_reasoning:
        request.reasoning.constraint_in_reasoning = True
    if tool_choice is not None:
        request.tool_choice.CopyFrom(to_tool_choice(tool_choice))
    if parallel_tool_calls is not None:
        request.parallel_tool_calls = parallel_tool_calls
    if grammar_backend is not None:
        if grammar_backend not in GRAMMAR_BACKENDS:
            raise ValueError(f"grammar_backend must be one of {', '.join(GRAMMAR_BACKENDS)}, not {grammar_backend!r}")
        request.grammar_backend = GRAMMAR_BACKENDS[grammar_backend]
    return request


def tokenize_request(prompt: str | None = None, *, messages: Messages | None = None,
                     add_generation_prompt: bool | None = None, tools: Iterable[Mapping[str, Any]] | None = None,
                     reasoning: bool | None = None) -> pb.TokenizeRequest:
    """A TokenizeRequest; with `tools` and `reasoning` the chat renders as generate() renders it."""
    request = pb.TokenizeRequest()
    _set_input(request, prompt, messages, None, add_generation_prompt)
    set_tools(request, tools, reasoning, None)
    return request


def _set_input(request: pb.GenerateRequest | pb.TokenizeRequest, prompt: str | None, messages: Messages | None,
               prompt_token_ids: Sequence[int] | None, add_generation_prompt: bool | None) -> None:
    given = [name for name, value in (("prompt", prompt), ("messages", messages),
                                      ("prompt_token_ids", prompt_token_ids)) if value is not None]
    if len(given) != 1:
        raise TypeError(f"give exactly one of prompt, messages or prompt_token_ids, got {given or 'none'}")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a string (use messages= for a chat), got {type(prompt).__name__}")
        request.prompt = prompt
    elif messages is not None:
        request.chat.messages.extend(to_message(m) for m in messages)
        if add_generation_prompt is not None:
            request.chat.add_generation_prompt = add_generation_prompt
    elif isinstance(request, pb.GenerateRequest) and prompt_token_ids is not None:
        request.prompt_token_ids.ids.extend(prompt_token_ids)


def extract_prompt(schema: Mapping[str, Any] | str | bool, text: str, instructions: str | None = None) -> str:
    """The user message extract() sends: the text, then the instructions, by default "Extract
    <the object's property names> from this text as JSON." The schema itself is not in the prompt:
    with the default small model, that made answers measurably worse than naming the fields (the
    constraint fixes the shape anyway); say what a field means in `instructions` when its name
    does not. The Node client builds the same message."""
    if instructions is None:
        parsed = json.loads(schema) if isinstance(schema, str) else schema
        properties = parsed.get("properties") if isinstance(parsed, Mapping) else None
        names = ", ".join(properties) if isinstance(properties, Mapping) and properties else "the information"
        instructions = f"Extract {names} from this text as JSON."
    return f"{text}\n\n{instructions}"


def extract_request(schema: Mapping[str, Any] | str, text: str, instructions: str | None = None, *,
                    max_tokens: int | None = None, temperature: float = 0.0, strict: bool | None = None,
                    any_whitespace: bool | None = None, jump_forward: bool | None = None,
                    whitespace: str | None = None, close_early: bool | None = None,
                    speculative: bool | None = None, request_id: str = "") -> pb.GenerateRequest:
    """The request extract() sends: extract_prompt() as the user's message, the schema as the
    constraint, greedy unless `temperature` says otherwise."""
    return generate_request(
        messages=[{"role": "user", "content": extract_prompt(schema, text, instructions)}],
        constraint=json_schema(schema, strict=strict, any_whitespace=any_whitespace, jump_forward=jump_forward,
                               whitespace=whitespace, close_early=close_early),
        max_tokens=max_tokens, temperature=temperature, speculative=speculative, request_id=request_id)


def extraction_result(response: pb.GenerateResponse) -> Any:
    """The parsed JSON of a finished extract() response (a dict for an object schema). Raises
    IncompleteOutputError unless the output ended because the schema's JSON was complete."""
    if response.finish_reason != pb.FINISH_REASON_STOP:
        raise IncompleteOutputError(response, pb.FinishReason.Name(response.finish_reason))
    return json.loads(response.text)
