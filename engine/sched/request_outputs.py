"""What the scheduler reports for a request: its new tokens, with its counters on the first output
(for time to first token), on every output once it drafted, and on the final one (the totals)."""
from __future__ import annotations

import time

import msgspec

from engine.protocol import EngineCoreOutput, RequestCounters, TokenLogprob
from engine.sched.request import FINISH_REASON_OF_STATUS, Request


def step_output(request: Request, new_token_ids: list[int], logprobs: list[TokenLogprob]) -> EngineCoreOutput:
    """The output of a running request's step. Its first carries the counters (the prompt's are
    known by then), and so does every output of a request that drafted: the front end may end it on
    a stop string, and then it never sees the final output."""
    is_first = request.num_output_tokens == len(new_token_ids)
    counters = counters_now(request) if is_first or request.counters.num_draft_tokens else None
    return EngineCoreOutput(request.request_id, new_token_ids, logprobs, counters=counters)


def final_output(request: Request, new_token_ids: list[int], logprobs: list[TokenLogprob] | None = None
                 ) -> EngineCoreOutput:
    """The last output of a finished request, with all its counters."""
    structured_output = request.structured_output
    grammar = request.grammar
    return EngineCoreOutput(
        request_id=request.request_id,
        new_token_ids=new_token_ids,
        new_logprobs=logprobs or [],
        finish_reason=int(FINISH_REASON_OF_STATUS[request.status]),
        stop_reason=request.stop_reason,
        error=request.error,
        error_kind=request.error_kind,
        counters=counters_now(request),
        not_enforced=list(grammar.not_enforced) if grammar is not None else [],
        grammar_cache_hit=structured_output is not None and structured_output.grammar_cache_hit,
        grammar_backend=structured_output.grammar_backend if structured_output is not None else "",
        closed_early=structured_output.closed_early if structured_output is not None else "",
    )


def counters_now(request: Request) -> RequestCounters:
    """A copy of the request's counters (an output keeps what they were), its timings as of now:
    arrival -> first scheduled (now if it never was), arrival -> grammar compiled (0 without one)."""
    arrival = request.arrival_time
    first_scheduled = request.first_scheduled_time or time.monotonic()
    structured_output = request.structured_output
    grammar_ready = structured_output.grammar_ready_time if structured_output is not None else None
    return msgspec.structs.replace(request.counters, queued_s=max(first_scheduled - arrival, 0.0),
                                   grammar_wait_s=max((grammar_ready or arrival) - arrival, 0.0))
