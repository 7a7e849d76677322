"""RequestOutputs -> OpenAI response bodies (plain dicts, JSON-encoded by the caller).

Chat and text completions, whole or as stream chunks (a chat answer's think section as
`reasoning_content` and its tool calls as `tool_calls`, as vLLM sends them), with `usage` and
Formwork's extension field `formwork` (per choice: timings in seconds, forward passes, forced
tokens, not-enforced schema parts).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from engine.protocol import FinishReason
from service import assistant_output

if TYPE_CHECKING:
    from engine.frontend.output_processor import RequestOutput
    from engine.protocol import TokenLogprob
    from service.assistant_output import AssistantStream, OutputShape, ParsedCall

TokenText = Callable[[int], str]

_FINISH_REASON = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length", FinishReason.ABORT: "abort",
                  FinishReason.ERROR: "error"}


def finish_reason(output: RequestOutput) -> str | None:
    return _FINISH_REASON[output.finish_reason] if output.finished and output.finish_reason is not None else None


def usage(finals: Sequence[RequestOutput], num_choices: int) -> dict[str, Any]:
    """Token counts; a prompt counts once however many choices it has (as OpenAI counts), and its
    cached tokens are those of its first choice (the others reuse its prefix)."""
    first_choices = finals[::num_choices]
    prompt_tokens = sum(o.num_prompt_tokens for o in first_choices)
    completion_tokens = sum(o.num_output_tokens for o in finals)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": sum(o.counters.num_cached_tokens for o in first_choices)}}


def running_usage(num_prompt_tokens: int, num_output_tokens: int) -> dict[str, Any]:
    """Usage so far, on every chunk of a stream with stream_options.continuous_usage_stats."""
    return {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_output_tokens,
            "total_tokens": num_prompt_tokens + num_output_tokens}


def formwork_extension(finals: Sequence[RequestOutput]) -> dict[str, Any]:
    choices = []
    for index, output in enumerate(finals):
        counters = output.counters
        entry: dict[str, Any] = {"index": index, "forward_passes": counters.num_forward_passes,
                                 "forced_tokens": counters.num_forced_tokens}
        if output.timings is not None:
            t = output.timings
            entry["timings"] = {"queued_s": t.queued_s, "grammar_wait_s": t.grammar_wait_s,
                                "time_to_first_token_s": t.ttft_s, "total_s": t.total_s}
        if output.not_enforced:
            entry["not_enforced"] = list(output.not_enforced)
        if output.closed_early:
            entry["closed_early"] = output.closed_early
        if output.grammar_backend:  # the grammar library that enforced the constraint
            entry["grammar_backend"] = output.grammar_backend
        if counters.num_draft_tokens:  # speculative decoding: drafted and accepted tokens
            entry["draft_tokens"] = counters.num_draft_tokens
            entry["accepted_draft_tokens"] = counters.num_accepted_draft_tokens
        choices.append(entry)
    return {"choices": choices}


def chat_completion(response_id: str, created: int, model: str, finals: Sequence[RequestOutput],
                    token_text: TokenText, logprobs: bool, shape: OutputShape | None = None) -> dict[str, Any]:
    choices = []
    for index, output in enumerate(finals):
        message: dict[str, Any] = {"role": "assistant", "content": output.text}
        reason = finish_reason(output)
        if shape is not None and not shape.plain:
            parts = assistant_output.split(output.text, shape)
            message["content"] = parts.content if parts.content or not parts.calls else None
            if shape.reasoning is not None:
                message["reasoning_content"] = parts.reasoning
            if parts.calls:
                message["tool_calls"] = [_tool_call(call) for call in parts.calls]
                reason = "tool_calls" if reason == "stop" else reason
        choices.append({"index": index, "message": message,
                        "logprobs": chat_logprobs(output.logprobs or [], token_text) if logprobs else None,
                        "finish_reason": reason})
    return {
        "id": response_id, "object": "chat.completion", "created": created, "model": model,
        "choices": choices,
        "usage": usage(finals, len(finals)),
        "formwork": formwork_extension(finals),
    }


def completion(response_id: str, created: int, model: str, finals: Sequence[RequestOutput], num_choices: int,
               token_text: TokenText, logprobs: bool) -> dict[str, Any]:
    return {
        "id": response_id, "object": "text_completion", "created": created, "model": model,
        "choices": [{
            "index": index,
            "text": output.text,
            "logprobs": completion_logprobs(output.logprobs or [], token_text) if logprobs else None,
            "finish_reason": finish_reason(output),
        } for index, output in enumerate(finals)],
        "usage": usage(finals, num_choices),
        "formwork": formwork_extension(finals),
    }


def chat_chunks(response_id: str, created: int, model: str, index: int, output: RequestOutput | None,
                token_text: TokenText, logprobs: bool, include_usage: bool, first: bool,
                reader: AssistantStream | None = None, usage_so_far: dict[str, Any] | None = None
                ) -> list[dict[str, Any]]:
    """One choice's step as chunks; `output` None: the opening chunk that carries the role. With
    `reader`, the step's text is split into reasoning_content, content and tool-call deltas, one
    chunk each, as OpenAI and vLLM stream them: a call's first delta has its id, type, name and
    arguments "", the next ones pieces of its arguments. The step's logprobs ride on its first
    chunk, its finish_reason on the last; `usage_so_far` (continuous usage) on every chunk."""
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""} if first
                                    else {"content": output.delta_text if output else ""}]
    reason = finish_reason(output) if output else None
    if reader is not None and output is not None and not first:
        deltas = _assistant_deltas(reader, output)
        if reason == "stop" and reader.num_calls:
            reason = "tool_calls"
    chunks = []
    for number, delta in enumerate(deltas):
        choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None,
                                  "finish_reason": reason if number == len(deltas) - 1 else None}
        if logprobs and output is not None and number == 0:
            choice["logprobs"] = chat_logprobs(output.new_logprobs or [], token_text)
        chunk = {"id": response_id, "object": "chat.completion.chunk", "created": created, "model": model,
                 "choices": [choice]}
        if include_usage or usage_so_far is not None:
            chunk["usage"] = usage_so_far
        chunks.append(chunk)
    return chunks


def _assistant_deltas(reader: AssistantStream, output: RequestOutput) -> list[dict[str, Any]]:
    parts = reader.step(output.text, output.finished)
    delta: dict[str, Any] = {}
    if parts.reasoning:
        delta["reasoning_content"] = parts.reasoning
    if parts.content or not (parts.reasoning or parts.call_deltas):
        delta["content"] = parts.content
    deltas = [delta] if delta else []
    for call in parts.call_deltas:
        if call.id:
            deltas.append({"tool_calls": [{"index": call.index, "id": call.id, "type": "function",
                                           "function": {"name": call.name, "arguments": ""}}]})
        else:
            deltas.append({"tool_calls": [{"index": call.index, "function": {"arguments": call.arguments}}]})
    return deltas


def _tool_call(call: ParsedCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def completion_chunk(response_id: str, created: int, model: str, index: int, output: RequestOutput,
                     token_text: TokenText, logprobs: bool, include_usage: bool,
                     usage_so_far: dict[str, Any] | None = None) -> dict[str, Any]:
    choice = {"index": index, "text": output.delta_text,
              "logprobs": completion_logprobs(output.new_logprobs or [], token_text) if logprobs else None,
              "finish_reason": finish_reason(output)}
    chunk = {"id": response_id, "object": "text_completion", "created": created, "model": model, "choices": [choice]}
    if include_usage or usage_so_far is not None:
        chunk["usage"] = usage_so_far
    return chunk


def usage_chunk(response_id: str, created: int, model: str, obj: str, finals: Sequence[RequestOutput],
                num_choices: int) -> dict[str, Any]:
    """The last chunk with stream_options.include_usage: no choices, the usage, Formwork's extension."""
    return {"id": response_id, "object": obj, "created": created, "model": model, "choices": [],
            "usage": usage(finals, num_choices), "formwork": formwork_extension(finals)}


def chat_logprobs(logprobs: Sequence[TokenLogprob], token_text: TokenText) -> dict[str, Any]:
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {"content": [{**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, l) for t, l in lp.top]}
                        for lp in logprobs]}


def completion_logprobs(logprobs: Sequence[TokenLogprob], token_text: TokenText) -> dict[str, Any]:
    tokens = [token_text(lp.token_id) for lp in logprobs]
    offsets, offset = [], 0
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in logprobs],
            "top_logprobs": [{token_text(t): l for t, l in lp.top} for lp in logprobs], "text_offset": offsets}
