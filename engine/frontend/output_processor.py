"""Front-end side of every request: engine-core token ids in, client-facing outputs out.

Shared by the offline `LLM` and the gRPC service. The engine core never sees text, so stop strings
are matched here; when one matches, the request is finished at once (tokens after it are dropped)
and its id is handed back so the caller can abort it in the core and free its KV blocks.

Runs every engine step for every request with news: per step it does a dict lookup, decodes a
window of a few tokens, and (only for streaming requests, or at the end) builds one output.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import msgspec

from engine.frontend.detokenizer import IncrementalDetokenizer
from engine.protocol import EngineCoreOutput, ErrorKind, FinishReason, RequestCounters, TokenLogprob
from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.frontend.tokenizer import Tokenizer


class RequestTimings(msgspec.Struct):
    """Seconds from the request's arrival at the front end."""

    queued_s: float = 0.0  # -> first scheduled (reported by the core)
    grammar_wait_s: float = 0.0  # -> grammar compiled (reported by the core; 0 without a constraint)
    ttft_s: float = 0.0  # -> first output token received by the front end
    total_s: float = 0.0  # -> finished, seen by the front end


class RequestOutput(msgspec.Struct):
    """One request's state after a step. `text` / `token_ids` are cumulative snapshots,
    `delta_text` / `new_token_ids` / `new_logprobs` what this step added; the deltas of all outputs
    of a request concatenate to the final `text` / `token_ids`."""

    request_id: str
    text: str
    delta_text: str
    token_ids: list[int]
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None  # the stop string, or the stop / eos token id, that ended it
    error: str | None = None  # with FinishReason.ERROR: a message the client can act on
    error_kind: ErrorKind | None = None  # with error: what caused it
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0  # == len(token_ids)
    # the core's counters (cached prompt tokens, forward passes, forced and draft tokens); final output only
    counters: RequestCounters = msgspec.field(default_factory=RequestCounters)
    timings: RequestTimings | None = None  # on the final output only
    # None unless requested; one per sampled token, in order (jump-forward tokens are not sampled
    # and have none, so match on TokenLogprob.token_id rather than on position)
    logprobs: list[TokenLogprob] | None = None
    new_logprobs: list[TokenLogprob] | None = None
    not_enforced: list[str] = []  # best-effort constraint: parts of the schema not enforced
    grammar_cache_hit: bool = False  # final output: the constraint's grammar came from the compile cache
    grammar_backend: str = ""  # final output: the grammar library that enforced the constraint
    # the engine completed the output before the model did: "budget", "repetition", "digits" or
    # "depth" (EngineCoreOutput.closed_early); "" if the model finished it
    closed_early: str = ""


class _RequestState:
    """What the front end remembers about one unfinished request."""

    __slots__ = ("request_id", "num_prompt_tokens", "sampling_params", "arrival_time", "stream",
                 "detokenizer", "token_ids", "logprobs", "num_sent_tokens", "num_sent_logprobs",
                 "first_token_time", "counters", "not_enforced")

    def __init__(self, request_id: str, num_prompt_tokens: int, sampling_params: SamplingParams,
                 arrival_time: float, stream: bool, detokenizer: IncrementalDetokenizer) -> None:
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.sampling_params = sampling_params
        self.arrival_time = arrival_time
        self.stream = stream
        self.detokenizer = detokenizer
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprob] | None = [] if sampling_params.logprobs is not None else None
        self.num_sent_tokens = 0  # token_ids already handed out in earlier outputs
        self.num_sent_logprobs = 0
        self.first_token_time: float | None = None
        # the core's latest counters: a request stopped here by a stop string never gets the
        # core's final output, so the last ones an earlier output carried are kept
        self.counters = RequestCounters()
        self.not_enforced: list[str] = []

    def absorb_core_counters(self, output: EngineCoreOutput) -> None:
        if output.counters is not None:
            self.counters = output.counters
        if output.not_enforced:
            self.not_enforced = output.not_enforced


class OutputProcessor:
    """Per-request detokenization, stop strings, accumulation and counters for the front end.

    Not thread-safe: call it from the one loop that talks to the engine core.
    """

    def __init__(self, tokenizer: Tokenizer, clock: Callable[[], float] = time.monotonic) -> None:
        self.tokenizer = tokenizer
        self._clock = clock  # must match the clock of arrival_time (time.monotonic by default)
        self._requests: dict[str, _RequestState] = {}

    def add_request(self, request_id: str, prompt_token_ids: Sequence[int], sampling_params: SamplingParams,
                    arrival_time: float | None = None, stream: bool = True) -> None:
        """Start tracking a request (before it is sent to the core).

        stream: produce an output every step that brings tokens; False: only the final output
        (offline generate, unary RPCs), which saves building a snapshot every step.
        """
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        detokenizer = IncrementalDetokenizer(
            self.tokenizer, skip_special_tokens=True, stop=sampling_params.stop,
            include_stop_str_in_output=sampling_params.include_stop_str_in_output,
            min_tokens=sampling_params.min_tokens)
        self._requests[request_id] = _RequestState(
            request_id, len(prompt_token_ids), sampling_params,
            self._clock() if arrival_time is None else arrival_time, stream, detokenizer)

    def process_outputs(self, outputs: Sequence[EngineCoreOutput]) -> tuple[list[RequestOutput], list[str]]:
        """Consume one step of core outputs.

        Returns the outputs to hand to clients (streaming requests with new tokens, and every
        request that finished), and the ids of requests that finished here because of a stop
        string while the core still runs them: the caller must abort those in the core.
        Outputs for unknown (finished or aborted) requests are ignored.
        """
        request_outputs: list[RequestOutput] = []
        to_abort: list[str] = []
        now = self._clock()
        for output in outputs:
            state = self._requests.get(output.request_id)
            if state is None:
                continue  # already finished here: the core raced our abort
            state.absorb_core_counters(output)
            finish_reason = None if output.finish_reason is None else FinishReason(output.finish_reason)
            stop_reason = output.stop_reason
            new_token_ids = output.new_token_ids
            new_logprobs = output.new_logprobs if state.logprobs is not None else None

            if new_token_ids:
                if state.first_token_time is None:
                    state.first_token_time = now
                detokenizer = state.detokenizer
                text_token_ids = new_token_ids
                if (finish_reason == FinishReason.STOP and not state.sampling_params.include_stop_str_in_output
                        and self._is_stop_token(new_token_ids[-1], stop_reason)):
                    text_token_ids = new_token_ids[:-1]  # the stop token stays in token_ids, not in text
                num_consumed = detokenizer.update(text_token_ids)
                if detokenizer.stop_str is not None:
                    # a stop string ended it: drop the tokens after the one that completed it
                    new_token_ids = new_token_ids[:num_consumed]
                    if new_logprobs is not None:
                        # sampled tokens come before forced ones in an output, so logprobs are a prefix
                        new_logprobs = new_logprobs[:num_consumed]
                    if finish_reason is None:
                        to_abort.append(state.request_id)
                    finish_reason, stop_reason = FinishReason.STOP, detokenizer.stop_str
                state.token_ids.extend(new_token_ids)
                if new_logprobs:
                    state.logprobs.extend(new_logprobs)

            if finish_reason is not None:
                del self._requests[state.request_id]
                final = self._final_output(state, finish_reason, stop_reason, output.error, now)
                final.error_kind = output.error_kind
                final.grammar_cache_hit = output.grammar_cache_hit
                final.grammar_backend = output.grammar_backend
                final.closed_early = output.closed_early
                request_outputs.append(final)
            elif state.stream and new_token_ids:
                request_outputs.append(self._make_output(state))
        return request_outputs, to_abort

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop tracking a request the client gave up on (the caller also aborts it in the core).

        Returns its final output (FinishReason.ABORT, text so far), or None if it is not tracked.
        """
        state = self._requests.pop(request_id, None)
        if state is None:
            return None
        return self._final_output(state, FinishReason.ABORT, None, None, self._clock())

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    # ---- internals ----------------------------------------------------------------------------

    def _is_stop_token(self, token_id: int, stop_reason: str | int | None) -> bool:
        if isinstance(stop_reason, int):
            return token_id == stop_reason
        # the core may leave stop_reason unset for EOS; a grammar that completed ends on a normal token
        return stop_reason is None and token_id in self.tokenizer.eos_token_ids

    @staticmethod
    def _make_output(state: _RequestState) -> RequestOutput:
        """A snapshot; the new_* fields hold what no earlier output of this request carried."""
        detokenizer = state.detokenizer
        delta_text = detokenizer.get_delta()
        num_sent, num_sent_logprobs = state.num_sent_tokens, state.num_sent_logprobs
        state.num_sent_tokens = len(state.token_ids)
        logprobs = state.logprobs
        if logprobs is not None:
            state.num_sent_logprobs = len(logprobs)
        return RequestOutput(
            request_id=state.request_id,
            text=detokenizer.emitted_text,
            delta_text=delta_text,
            token_ids=state.token_ids[:],
            new_token_ids=state.token_ids[num_sent:],
            num_prompt_tokens=state.num_prompt_tokens,
            num_output_tokens=len(state.token_ids),
            logprobs=None if logprobs is None else logprobs[:],
            new_logprobs=None if logprobs is None else logprobs[num_sent_logprobs:],
        )

    def _final_output(self, state: _RequestState, finish_reason: FinishReason, stop_reason: str | int | None,
                      error: str | None, now: float) -> RequestOutput:
        detokenizer = state.detokenizer
        already_stopped = detokenizer.stop_str is not None
        detokenizer.finish()  # release held-back bytes and stop-string prefixes
        if not already_stopped and detokenizer.stop_str is not None:
            # the released bytes completed a stop string
            finish_reason, stop_reason = FinishReason.STOP, detokenizer.stop_str
        output = self._make_output(state)
        output.finished = True
        output.finish_reason = finish_reason
        output.stop_reason = stop_reason
        output.error = error
        output.counters = state.counters
        output.not_enforced = state.not_enforced
        output.timings = RequestTimings(
            queued_s=state.counters.queued_s,
            grammar_wait_s=state.counters.grammar_wait_s,
            ttft_s=0.0 if state.first_token_time is None else state.first_token_time - state.arrival_time,
            total_s=now - state.arrival_time,
        )
        return output
