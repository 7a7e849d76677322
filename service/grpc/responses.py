"""Engine outputs and state -> formwork.v1 response messages."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.protocol import FinishReason
from grammar.constraint import CONSTRAINT_KINDS
from service import assistant_output
from service._gen.formwork.v1 import generation_pb2 as pb
from service.limits import MAX_LOGPROBS

if TYPE_CHECKING:
    from engine.frontend.output_processor import RequestOutput
    from engine.protocol import ConstraintReport, EngineCoreReady, EngineStats, TokenLogprob
    from service.assistant_output import AssistantStream, OutputShape
    from service.chat_format import ChatFormat
    from service.limits import ServiceLimits

_FINISH_REASON = {
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.ABORT: pb.FINISH_REASON_CANCELLED,
    FinishReason.ERROR: pb.FINISH_REASON_ERROR,
}
# the grammar library that served a constraint (the engine's name) -> its enum value
_GRAMMAR_BACKEND = {"xgrammar": pb.GRAMMAR_BACKEND_XGRAMMAR, "llguidance": pb.GRAMMAR_BACKEND_LLGUIDANCE}


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
        response.grammar_backend = _GRAMMAR_BACKEND.get(output.grammar_backend, pb.GRAMMAR_BACKEND_UNSPECIFIED)
    return response


def _token_logprob(logprob: TokenLogprob, token_text: Callable[[int], str]) -> pb.TokenLogprob:
    return pb.TokenLogprob(
        token_id=logprob.token_id, token=token_text(logprob.token_id), logprob=logprob.logprob,
        top=[pb.TopLogprob(token_id=t, token=token_text(t), logprob=lp) for t, lp in logprob.top])


def validate_constraint_response(report: ConstraintReport) -> pb.ValidateConstraintResponse:
    return pb.ValidateConstraintResponse(ok=report.ok, error=report.error, compile_s=report.compile_s,
                                         cached=report.cached, not_enforced=report.not_enforced,
                                         grammar_backend=_GRAMMAR_BACKEND.get(report.backend,
                                                                              pb.GRAMMAR_BACKEND_UNSPECIFIED))


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
