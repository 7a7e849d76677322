"""A request inside the engine core: its tokens, its progress, and its lifecycle."""
from __future__ import annotations

import bisect
import enum
import time
from typing import TYPE_CHECKING

from engine.protocol import ErrorKind, FinishReason, RequestCounters
from engine.sampling_params import SamplingParams
from engine.structured_output.request import StructuredOutputRequest

if TYPE_CHECKING:
    from collections.abc import Sequence

    from grammar.backend import Grammar


class RequestStatus(enum.IntEnum):
    """Ordered so that `status > PREEMPTED` means finished."""

    WAITING = 0
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = 1
    RUNNING = 2
    PREEMPTED = 3
    FINISHED_STOPPED = 4
    FINISHED_LENGTH_CAPPED = 5
    FINISHED_ABORTED = 6
    FINISHED_ERROR = 7

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.PREEMPTED


FINISH_REASON_OF_STATUS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
}


class Request:
    """Engine-core state of one request.

    Invariant: `num_computed_tokens <= num_tokens`; the scheduler's only rule is to let
    `num_computed_tokens` catch up with `num_tokens`.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_id: int | Sequence[int] | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        # the ids that end this request unless ignore_eos: one id or several (Llama 3, Qwen, Gemma)
        self.eos_token_ids: frozenset[int] = frozenset(
            () if eos_token_id is None else (eos_token_id,) if isinstance(eos_token_id, int) else eos_token_id)
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.priority = priority

        self.status = RequestStatus.WAITING
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_output_tokens = 0  # sampled + jump-forward tokens
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.first_scheduled_time: float | None = None  # monotonic
        self.stop_reason: int | str | None = None
        self.error: str | None = None  # with FINISHED_ERROR: why, for the client
        self.error_kind: ErrorKind | None = None  # with FINISHED_ERROR
        # what it cost and got, for the client (the timings are filled in when an output is built)
        self.counters = RequestCounters(num_prompt_tokens=len(self.prompt_token_ids))
        # its constraint's state (None without a constraint)
        self.structured_output = (StructuredOutputRequest(sampling_params.constraint)
                                  if sampling_params.constraint is not None else None)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens:]

    @property
    def is_finished(self) -> bool:
        return self.status > RequestStatus.PREEMPTED

    @property
    def use_structured_output(self) -> bool:
        return self.structured_output is not None

    @property
    def grammar(self) -> Grammar | None:
        """Its constraint's matcher, once compiled and activated."""
        return self.structured_output.grammar if self.structured_output is not None else None

    def append_output_token_ids(self, token_ids: list[int]) -> None:
        self.all_token_ids.extend(token_ids)
        self.num_output_tokens += len(token_ids)

    def rollback_computed_tokens(self, num_tokens: int) -> None:
        """The last `num_tokens` positions computed are not kept (a draft's rejected tokens; a
        sample skipped while its bitmask row was still filling). The one way back for
        `num_computed_tokens` but preemption, which starts over; their KV stays in the request's
        blocks and is overwritten when they are computed again."""
        self.num_computed_tokens -= num_tokens

    def take_forced_token_ids(self) -> list[int]:
        """The jump-forward tokens appended since the runner last heard of the request (it did not
        sample them): the runner is sent them now, or the whole request anew."""
        structured_output = self.structured_output
        if structured_output is None or not structured_output.num_forced_tokens_pending:
            return []
        num_pending, structured_output.num_forced_tokens_pending = structured_output.num_forced_tokens_pending, 0
        return self.all_token_ids[-num_pending:]

    def num_room_tokens(self, max_model_len: int) -> int:
        """Output tokens the request may still have: within max_tokens and the context."""
        return min(self.sampling_params.max_tokens - self.num_output_tokens, max_model_len - self.num_tokens)

    def stop_status(self, last_token_id: int, max_model_len: int) -> RequestStatus | None:
        """The finished status the request reaches with `last_token_id` (just appended), else None;
        a stop token becomes its stop_reason."""
        params = self.sampling_params
        grammar = self.grammar
        if grammar is not None and grammar.is_terminated():
            return RequestStatus.FINISHED_STOPPED
        if (not params.ignore_eos and last_token_id in self.eos_token_ids) or last_token_id in params.stop_token_ids:
            self.stop_reason = last_token_id
            return RequestStatus.FINISHED_STOPPED
        if self.num_output_tokens >= params.max_tokens or self.num_tokens >= max_model_len:
            return RequestStatus.FINISHED_LENGTH_CAPPED
        return None

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.name}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens})")


def insert_in_order(queue: list[Request], request: Request) -> None:
    """Insert by (priority, arrival_time), after any equal keys (first come, first served)."""
    keys = [(r.priority, r.arrival_time) for r in queue]
    queue.insert(bisect.bisect_right(keys, (request.priority, request.arrival_time)), request)
