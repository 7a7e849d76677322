"""A request inside the engine core: its tokens, its progress, and its lifecycle."""
from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING

from engine.protocol import FinishReason
from engine.sampling_params import SamplingParams
from engine.sched.acceptance_rate import AcceptanceRate

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.sched.text_drafter import PromptText
    from grammar.backend import Grammar
    from grammar.runtime.early_closing import EarlyClosing
    from grammar.runtime.slow_fills import SlowFills


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
        self.num_cached_tokens = -1  # prefix-cache hits at first schedule; -1 until then
        self.num_preemptions = 0
        self.stop_reason: int | str | None = None
        self.error: str | None = None
        self.constraint_error = False  # the error is the constraint's (a grammar limit or failure)

        # structured output
        self.grammar: Grammar | None = None
        self.slow_fills: SlowFills | None = None  # its fills over max_fill_ms, from the first one
        self.num_forced_tokens_pending = 0  # jump-forward tokens appended, not yet sent to the runner
        self.grammar_cache_hit = False  # its compiled grammar was in the compile cache on arrival
        self.num_forced_tokens = 0  # all jump-forward (and closing) tokens of this request
        self.closing: EarlyClosing | None = None  # set with the grammar when closing early is on
        self.closed_early = ""  # why the engine closed the output (EngineCoreOutput.closed_early)

        # speculative decoding (engine/sched/speculation.py)
        self.num_draft_tokens = 0  # draft tokens verified
        self.num_accepted_draft_tokens = 0  # of those, the ones the model agreed with
        self.num_rejected_drafts = 0  # drafts in a row rejected at their first token
        self.draft_pause_steps = 0  # steps left before it drafts again
        self.draft_acceptance = AcceptanceRate()  # of its recent drafts: how long the next one is
        self.draft_ngram = 0  # its last draft's acceptance key: the n-gram length it followed, or a COPY_/TEXT_ key
        self.copy_offset = 0  # its last draft's source: this many tokens behind its end (< 0; 0: none)
        self.draft_begin = 0  # where in its tokens its last draft was read
        self.copy_anchor = 0  # the prompt token after the last one its output copied (accepted drafts)
        self.prompt_text: PromptText | None = None  # its prompt's bytes, joined when it first drafts by text
        self.text_anchor = 0  # the prompt byte after the last one its output copied (accepted drafts)
        self.draft_text_ends: list[int] = []  # its last draft read from text: each token's end in the prompt

        # timings (monotonic seconds) and counters reported to clients
        self.first_scheduled_time: float | None = None
        self.grammar_ready_time: float | None = None  # its grammar compile ended (or failed)
        self.num_forward_passes = 0

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
        return self.sampling_params.constraint is not None

    def append_output_token_ids(self, token_ids: list[int]) -> None:
        self.all_token_ids.extend(token_ids)
        self.num_output_tokens += len(token_ids)

    def num_room_tokens(self, max_model_len: int) -> int:
        """Output tokens the request may still have: within max_tokens and the context."""
        return min(self.sampling_params.max_tokens - self.num_output_tokens, max_model_len - self.num_tokens)

    def stop_status(self, last_token_id: int, max_model_len: int) -> RequestStatus | None:
        """The finished status the request reaches with `last_token_id` (just appended), else None;
        a stop token becomes its stop_reason."""
        params = self.sampling_params
        if self.grammar is not None and self.grammar.is_terminated():
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
