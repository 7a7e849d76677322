"""formwork.v1 messages <-> engine structs. Every validation error names the request field.

Unset proto3 `optional` fields are left out of the engine structs, so the engine's own defaults
apply (SamplingParams, Constraint); the one exception is max_tokens, whose default is the
server's `default_max_tokens`.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from google.protobuf import struct_pb2

from engine.protocol import ConstraintReport, EngineStats, ErrorKind, FinishReason, TokenLogprob
from engine.sampling_params import SamplingParams
from grammar.constraint import CONSTRAINT_KINDS, Constraint
from service import assistant_output
from service._gen.formwork.v1 import generation_pb2 as pb
from service.errors import FieldViolation, ServiceError, StatusCode, invalid_argument
from service.limits import MAX_LOGPROBS, ServiceLimits

if TYPE_CHECKING:
    from engine.frontend.output_processor import RequestOutput
    from engine.protocol import EngineCoreReady
    from service.assistant_output import AssistantStream
    from service.chat_format import ChatFormat, OutputShape

# proto3 `optional` sampling fields, named as in SamplingParams
_OPTIONAL_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty",
                             "frequency_penalty", "presence_penalty", "ignore_eos", "include_stop_str_in_output",
                             "logprobs", "speculative")
_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty")
# SamplingParams field names, longest first: its ValueErrors start with the field they are about
_SAMPLING_FIELDS_LONGEST_FIRST = sorted(SamplingParams.__struct_fields__, key=len, reverse=True)
_CONSTRAINT_OPTIONS = ("strict", "any_whitespace", "jump_forward", "close_early")
_WHITESPACE = {pb.JSON_WHITESPACE_COMPACT: "compact", pb.JSON_WHITESPACE_SPACED: "spaced",
               pb.JSON_WHITESPACE_BOUNDED: "bounded", pb.JSON_WHITESPACE_ANY: "any"}
# Constraint.kind oneof field -> engine constraint kind
_GRAMMAR_SYNTAX = {pb.GRAMMAR_SYNTAX_EBNF: "ebnf", pb.GRAMMAR_SYNTAX_LARK: "lark"}
_ENGINE_KIND = {"json_schema": "json_schema", "json_schema_text": "json_schema", "json_object": "json_object",
                "regex": "regex", "grammar": "grammar", "choice": "choice"}

_FINISH_REASON = {
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.ABORT: pb.FINISH_REASON_CANCELLED,
    FinishReason.ERROR: pb.FINISH_REASON_ERROR,
}


@dataclass(frozen=True)
class PromptInput:
    """One of: text, chat messages (for the chat template), or token ids."""

    field: str  # the request field it came from: "prompt", "chat" or "prompt_token_ids"
    text: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    token_ids: list[int] | None = None
    tools: list[dict[str, Any]] | None = None  # for the chat template (service/chat_format.py)
    template_kwargs: dict[str, Any] | None = None  # more chat template variables (enable_thinking)


# ---- requests -----------------------------------------------------------------------------------


def prompt_from_proto(request: pb.GenerateRequest | pb.TokenizeRequest, vocab_size: int) -> PromptInput:
    which = request.WhichOneof("input")
    if which is None:
        fields = "prompt or chat" if isinstance(request, pb.TokenizeRequest) else "prompt, chat or prompt_token_ids"
        raise invalid_argument("input", f"set one of {fields}")
    if which == "prompt":
        if not request.prompt:
            raise invalid_argument("prompt", "must not be empty")
        return PromptInput(field="prompt", text=request.prompt)
    if which == "chat":
        chat = request.chat
        if not chat.messages:
            raise invalid_argument("chat.messages", "must hold at least one message")
        for index, message in enumerate(chat.messages):
            if not message.role:
                raise invalid_argument(f"chat.messages[{index}].role", "must not be empty")
        add_generation_prompt = chat.add_generation_prompt if chat.HasField("add_generation_prompt") else True
        return PromptInput(field="chat", messages=[_message(m) for m in chat.messages],
                           add_generation_prompt=add_generation_prompt)
    token_ids = list(request.prompt_token_ids.ids)
    if not token_ids:
        raise invalid_argument("prompt_token_ids.ids", "must hold at least one token id")
    bad = [t for t in token_ids if t >= vocab_size]
    if bad:
        raise invalid_argument("prompt_token_ids.ids", f"ids must be in [0, {vocab_size}); got {bad[:5]}")
    return PromptInput(field="prompt_token_ids", token_ids=token_ids)


def _message(message: pb.ChatMessage) -> dict[str, Any]:
    """A chat message as chat templates read it; a call's arguments as a JSON value when they parse."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": _json_or_text(c.arguments_json)}}
                             for c in message.tool_calls]
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    if message.name:
        out["name"] = message.name
    return out


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text) if text else {}
    except json.JSONDecodeError:
        return text


def sampling_params_from_proto(request: pb.GenerateRequest, limits: ServiceLimits, vocab_size: int) -> SamplingParams:
    """SamplingParams of a request: its set fields over the engine's defaults, validated."""
    kwargs: dict[str, Any] = {name: getattr(request, name) for name in _OPTIONAL_SAMPLING_FIELDS
                              if request.HasField(name)}
    for name in _FLOAT_FIELDS:
        if name in kwargs and not math.isfinite(kwargs[name]):
            raise invalid_argument(name, f"must be a finite number, got {kwargs[name]}")
    max_tokens = request.max_tokens if request.HasField("max_tokens") else limits.default_max_tokens
    if max_tokens < 1:
        raise invalid_argument("max_tokens", f"must be >= 1, got {max_tokens}")
    if max_tokens > limits.max_tokens_cap:
        raise invalid_argument("max_tokens", f"{max_tokens} exceeds this server's max_tokens_cap of "
                                             f"{limits.max_tokens_cap}")
    if request.stop:
        kwargs["stop"] = list(request.stop)
    if request.stop_token_ids:
        kwargs["stop_token_ids"] = list(request.stop_token_ids)
    if request.HasField("constraint"):
        kwargs["constraint"] = constraint_from_proto(request.constraint, limits)
    params = SamplingParams(max_tokens=max_tokens, **kwargs)
    try:
        params.validate(vocab_size)
    except ValueError as e:
        message = str(e)
        field = next((f for f in _SAMPLING_FIELDS_LONGEST_FIRST if message.startswith(f)), "sampling")
        raise invalid_argument(field, message[len(field):].lstrip() if field != "sampling" else message) from None
    return params


def constraint_from_proto(constraint: pb.Constraint, limits: ServiceLimits, field: str = "constraint") -> Constraint:
    """The engine Constraint, size-checked and validated (JSON syntax, non-empty spec, choices);
    whether it compiles is the grammar compiler's call."""
    kind = constraint.WhichOneof("kind")
    if kind is None:
        raise invalid_argument(field, "set one of json_schema, json_schema_text, json_object, regex, grammar, choice")
    path = f"{field}.{kind}"
    spec, choices = "", []
    if kind == "json_schema":
        # a Struct keeps no key order: sort, so the same schema always gives the same grammar
        spec = json.dumps(struct_to_python(constraint.json_schema), ensure_ascii=False, sort_keys=True)
    elif kind in ("json_schema_text", "regex", "grammar"):
        spec = getattr(constraint, kind)
    elif kind == "choice":
        choices = list(constraint.choice.choices)
    num_bytes = len(spec.encode()) + sum(len(c.encode()) for c in choices)
    if num_bytes > limits.max_constraint_bytes:
        raise invalid_argument(path, f"is {num_bytes} bytes; this server's max_constraint_bytes is "
                                     f"{limits.max_constraint_bytes}")
    options = {name: getattr(constraint, name) for name in _CONSTRAINT_OPTIONS if constraint.HasField(name)}
    if constraint.HasField("whitespace") and constraint.whitespace != pb.JSON_WHITESPACE_UNSPECIFIED:
        if constraint.whitespace not in _WHITESPACE:
            raise invalid_argument(f"{field}.whitespace", f"unknown value {constraint.whitespace}")
        options["whitespace"] = _WHITESPACE[constraint.whitespace]
    if constraint.HasField("grammar_syntax") and constraint.grammar_syntax != pb.GRAMMAR_SYNTAX_UNSPECIFIED:
        if constraint.grammar_syntax not in _GRAMMAR_SYNTAX:
            raise invalid_argument(f"{field}.grammar_syntax", f"unknown value {constraint.grammar_syntax}")
        if kind != "grammar":
            raise invalid_argument(f"{field}.grammar_syntax", f"applies to a grammar constraint, not {kind}")
        options["grammar_syntax"] = _GRAMMAR_SYNTAX[constraint.grammar_syntax]
    result = Constraint(kind=_ENGINE_KIND[kind], spec=spec, choices=choices, **options)
    try:
        result.validate()
    except ValueError as e:
        raise invalid_argument(path, str(e)) from None
    return result


def constraint_field(request: pb.GenerateRequest | pb.ValidateConstraintRequest) -> str | None:
    """"constraint.<kind>" of a constrained request (for errors the compiler reports later); None
    without a constraint."""
    kind = request.constraint.WhichOneof("kind") if request.HasField("constraint") else None
    if kind is None and getattr(request, "tools", None):
        return "tools"  # the tools' schemas are the request's constraint
    return f"constraint.{kind}" if kind else None


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


# ---- responses ----------------------------------------------------------------------------------


def generate_response(output: RequestOutput, request_id: str, token_text: Callable[[int], str],
                      delta: bool, shape: OutputShape | None = None,
                      reader: AssistantStream | None = None) -> pb.GenerateResponse:
    """A GenerateResponse: the whole output (unary), or what this output adds (`delta`, streaming);
    totals when the output is final, with the think section and tool calls read out per `shape`.
    A stream's `reader` (one per request, fed every output) adds the tool-call deltas."""
    text = output.delta_text if delta else output.text
    token_ids = output.new_token_ids if delta else output.token_ids
    logprobs = output.new_logprobs if delta else output.logprobs
    response = pb.GenerateResponse(request_id=request_id, text=text, token_ids=token_ids)
    if logprobs:
        response.logprobs.extend(_token_logprob(lp, token_text) for lp in logprobs)
    if reader is not None:
        response.tool_call_deltas.extend(
            pb.ToolCallDelta(index=d.index, id=d.id, name=d.name, arguments_delta=d.arguments)
            for d in reader.step(output.text, output.finished).call_deltas)
    if output.finished:
        assert output.finish_reason is not None
        response.finish_reason = _FINISH_REASON[output.finish_reason]
        if isinstance(output.stop_reason, str):
            response.stop_string = output.stop_reason
        elif isinstance(output.stop_reason, int):
            response.stop_token_id = output.stop_reason
        counters = output.counters
        response.usage.CopyFrom(pb.Usage(
            prompt_tokens=output.num_prompt_tokens, completion_tokens=output.num_output_tokens,
            cached_prompt_tokens=counters.num_cached_tokens, forced_tokens=counters.num_forced_tokens,
            draft_tokens=counters.num_draft_tokens, accepted_draft_tokens=counters.num_accepted_draft_tokens))
        timings = output.timings
        if timings is not None:
            response.timings.CopyFrom(pb.Timings(
                queued_s=timings.queued_s, grammar_wait_s=timings.grammar_wait_s,
                time_to_first_token_s=timings.ttft_s, total_s=timings.total_s,
                forward_passes=counters.num_forward_passes))
        response.not_enforced.extend(output.not_enforced)
        if shape is not None and not shape.plain:
            parts = (reader.final_parts(output.text) if reader is not None
                     else assistant_output.split(output.text, shape))
            response.reasoning, response.content = parts.reasoning, parts.content
            response.tool_calls.extend(pb.ToolCall(id=c.id, name=c.name, arguments_json=c.arguments)
                                       for c in parts.calls)
        response.closed_early = output.closed_early
    return response


def error_from_output(output: RequestOutput, constraint_field: str | None) -> ServiceError:
    """The status for an output that ended with FinishReason.ERROR.

    Before any token, the request itself was at fault (its grammar did not compile, or the core
    refused it): INVALID_ARGUMENT, naming the constraint if there is one. After tokens, the
    constraint's fault (a grammar limit, its grammar work failed) is still INVALID_ARGUMENT; any
    other failure mid-generation (e.g. a grammar dead end) is INTERNAL. Only this request ends.
    """
    error = output.error or "the engine ended the request with an error"
    if output.token_ids and output.error_kind == ErrorKind.CONSTRAINT and constraint_field is not None:
        error = f"{error} (after {len(output.token_ids)} tokens)"
        return ServiceError(StatusCode.INVALID_ARGUMENT, f"{constraint_field}: {error}",
                            [FieldViolation(constraint_field, error)])
    if output.token_ids:
        return ServiceError(StatusCode.INTERNAL, f"generation failed after {len(output.token_ids)} tokens: {error}")
    if constraint_field is not None:
        return ServiceError(StatusCode.INVALID_ARGUMENT, f"{constraint_field}: {error}",
                            [FieldViolation(constraint_field, error)])
    return ServiceError(StatusCode.INVALID_ARGUMENT, error)


def _token_logprob(logprob: TokenLogprob, token_text: Callable[[int], str]) -> pb.TokenLogprob:
    return pb.TokenLogprob(
        token_id=logprob.token_id, token=token_text(logprob.token_id), logprob=logprob.logprob,
        top=[pb.TopLogprob(token_id=t, token=token_text(t), logprob=lp) for t, lp in logprob.top])


def validate_constraint_response(report: ConstraintReport) -> pb.ValidateConstraintResponse:
    return pb.ValidateConstraintResponse(ok=report.ok, error=report.error, compile_s=report.compile_s,
                                         cached=report.cached, not_enforced=report.not_enforced)


@dataclass(frozen=True)
class RestartStats:
    """What the supervisor reports in ModelInfo."""

    num_restarts: int = 0
    last_crash: str = ""
    num_quarantined: int = 0


def model_info(info: EngineCoreReady, stats: EngineStats, limits: ServiceLimits, num_in_flight: int,
               restarts: RestartStats = RestartStats(), chat_format: ChatFormat | None = None) -> pb.ModelInfo:
    result = pb.ModelInfo(
        model_name=info.model_name,
        max_model_len=info.max_model_len,
        vocab_size=info.vocab_size,
        limits=pb.Limits(
            default_max_tokens=limits.default_max_tokens, max_tokens_cap=limits.max_tokens_cap,
            max_constraint_bytes=limits.max_constraint_bytes, max_message_bytes=limits.max_message_bytes,
            max_num_seqs=info.max_num_seqs, max_queue_len=info.max_num_waiting, kv_block_size=info.block_size,
            max_logprobs=MAX_LOGPROBS),
        constraint_kinds=CONSTRAINT_KINDS,
        load=pb.Load(
            num_running=stats.num_running, num_waiting=stats.num_waiting,
            num_waiting_for_grammar=stats.num_waiting_for_grammar, num_free_kv_blocks=stats.num_free_blocks,
            num_total_kv_blocks=stats.num_total_blocks, num_cached_kv_blocks=stats.num_cached_blocks,
            num_in_flight=num_in_flight, num_steps=stats.num_steps,
            num_grammar_cache_hits=stats.num_grammar_cache_hits, num_grammar_compiles=stats.num_grammar_compiles),
        num_engine_restarts=restarts.num_restarts,
        last_engine_crash=restarts.last_crash,
        num_quarantined_constraints=restarts.num_quarantined,
    )
    if chat_format is not None:
        result.tool_call_syntax = chat_format.tool_syntax
        if chat_format.reasoning is not None:
            result.reasoning_start, result.reasoning_end = chat_format.reasoning.start, chat_format.reasoning.end
    return result
