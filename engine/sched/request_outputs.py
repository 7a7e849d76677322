"""What the scheduler reports for a request: its new tokens, with the counters the front end needs
on the first output (for time to first token) and on the final one (for the response's totals)."""
from __future__ import annotations

import time

from engine.protocol import EngineCoreOutput, TokenLogprob
from engine.sched.request import FINISH_REASON_OF_STATUS, Request


def step_output(request: Request, new_token_ids: list[int], logprobs: list[TokenLogprob]) -> EngineCoreOutput:
    """The output of a running request's step; its first carries the prompt's counters. A request
    that drafted carries its draft counts so far: the front end may end it on a stop string, and
    then it never sees the final output."""
    drafts = {"num_draft_tokens": request.num_draft_tokens,
              "num_accepted_draft_tokens": request.num_accepted_draft_tokens} if request.num_draft_tokens else {}
    if request.num_output_tokens != len(new_token_ids):
        return EngineCoreOutput(request.request_id, new_token_ids, logprobs, **drafts)
    return EngineCoreOutput(
        request.request_id, new_token_ids, logprobs, num_prompt_tokens=request.num_prompt_tokens,
        num_cached_tokens=max(request.num_cached_tokens, 0),
        queued_s=max((request.first_scheduled_time or 0.0) - request.arrival_time, 0.0),
        grammar_wait_s=grammar_wait_s(request), **drafts)


def final_output(request: Request, new_token_ids: list[int], logprobs: list[TokenLogprob] | None = None
                 ) -> EngineCoreOutput:
    """The last output of a finished request, with all its counters."""
    first = request.first_scheduled_time or time.monotonic()
    return EngineCoreOutput(
        request_id=request.request_id,
        new_token_ids=new_token_ids,
        new_logprobs=logprobs or [],
        finish_reason=int(FINISH_REASON_OF_STATUS[request.status]),
        stop_reason=request.stop_reason,
        error=request.error,
        num_prompt_tokens=request.num_prompt_tokens,
        num_cached_tokens=max(request.num_cached_tokens, 0),
        num_forward_passes=request.num_forward_passes,
        num_forced_tokens=request.num_forced_tokens,
        queued_s=max(first - request.arrival_time, 0.0),
        grammar_wait_s=grammar_wait_s(request),
        not_enforced=list(request.grammar.not_enforced) if request.grammar is not None else [],
        constraint_error=request.constraint_error,
        grammar_cache_hit=request.grammar_cache_hit,
        closed_early=request.closed_early,
        num_draft_tokens=request.num_draft_tokens,
        num_accepted_draft_tokens=request.num_accepted_draft_tokens,
    )


def grammar_wait_s(request: Request) -> float:
    """Arrival -> its grammar compiled (0 without a constraint)."""
    return max((request.grammar_ready_time or request.arrival_time) - request.arrival_time, 0.0)
