"""The scheduler: one catch-up rule, no prefill/decode phases.

Each step every request gets tokens so that `num_computed_tokens` catches up with `num_tokens`,
within the token budget, the sequence cap and the free KV blocks: running requests first, then
waiting ones, both in (priority, arrival) order (a lower priority value goes first). A prompt, a
prompt chunk, a decode, jump-forward text and a resumed request are all the same rule.

When the KV cache is full, the running request that comes last in that order is preempted (the
lowest priority, and among equals the newest arrival): its blocks are freed and it goes back to
waiting, to be recomputed later. A request never preempts one that comes before it; when it is
itself the last, it preempts itself, and no waiting request is admitted in that step.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from engine.config import CacheConfig, SchedulerConfig
from engine.kv_cache.manager import KVCacheManager
from engine.protocol import EngineCoreOutput, ErrorKind
from engine.sched.output_appender import OutputAppender
from engine.sched.request import Request, RequestStatus, insert_in_order
from engine.sched.request_outputs import final_output, step_output
from engine.sched.scheduler_output import ModelRunnerOutput, NewRequestData, SchedulerOutput
from engine.sched.step_plan import StepPlan, bitmask_rows
from engine.structured_output.manager import grammar_failure

if TYPE_CHECKING:
    from engine.kv_cache.block_pool import KVCacheBlock
    from engine.sched.drafter import Drafter
    from engine.structured_output.grammar_output import GrammarOutput
    from engine.structured_output.manager import StructuredOutputManager

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        num_blocks: int,
        max_model_len: int,
        structured_output_manager: StructuredOutputManager | None = None,
        speculator: Drafter | None = None,
    ) -> None:
        """`speculator`: who drafts (engine/spec_decode/speculator.py); None: nobody drafts."""
        self.config = scheduler_config
        self.max_model_len = max_model_len
        self.kv_cache_manager = KVCacheManager(num_blocks, cache_config.block_size,
                                               cache_config.enable_prefix_caching)
        self.structured_output_manager = structured_output_manager
        self.speculator = speculator
        self.output_appender = OutputAppender(max_model_len, structured_output_manager, self._finish,
                                              self._finish_with_error)
        self.requests: dict[str, Request] = {}
        # both sorted by (priority, arrival_time): the last running request is the one to preempt
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        # finished or preempted since the last schedule(): the runner drops their state
        self.finished_req_ids: set[str] = set()
        self.preempted_req_ids: set[str] = set()
        # outputs of requests that ended outside update_from_output (grammar compile failures)
        self._pending_outputs: list[EngineCoreOutput] = []
        self.num_steps = 0
        self.num_preemptions = 0

    # ---- requests in and out -------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        if request.structured_output is not None and self.structured_output_manager is not None:
            self.structured_output_manager.grammar_init(request.request_id, request.structured_output)
            request.status = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
        self._enqueue_waiting(request)

    def _enqueue_waiting(self, request: Request) -> None:
        insert_in_order(self.waiting, request)

    def abort_requests(self, request_ids: list[str]) -> None:
        for req_id in request_ids:
            request = self.requests.get(req_id)
            if request is not None and not request.is_finished:
                self._finish(request, RequestStatus.FINISHED_ABORTED)

    def _finish(self, request: Request, status: RequestStatus) -> None:
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.status = status
        self.kv_cache_manager.free(request)
        if self.structured_output_manager is not None:
            self.structured_output_manager.forget(request.request_id)
        if self.speculator is not None:
            self.speculator.forget(request.request_id)
        self.finished_req_ids.add(request.request_id)
        del self.requests[request.request_id]

    def _finish_with_error(self, request: Request, kind: ErrorKind, error: str) -> None:
        """End the request with FINISHED_ERROR: `error` tells the client why."""
        request.error, request.error_kind = error, kind
        self._finish(request, RequestStatus.FINISHED_ERROR)

    def report(self, output: EngineCoreOutput) -> None:
        """Queue an output for the next update_from_output (a request rejected before it was added)."""
        self._pending_outputs.append(output)

    @property
    def num_waiting_for_grammar(self) -> int:
        """Waiting requests whose grammar is still compiling. A request keeps the
        WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR status until it reaches a batch slot, so the status
        alone would count cached grammars queued for a slot."""
        manager = self.structured_output_manager
        if manager is None:
            return 0
        return sum(manager.is_compiling(r.request_id) for r in self.waiting
                   if r.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or bool(self._pending_outputs)

    # ---- planning ----------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Plan one step and advance `num_computed_tokens` of every scheduled request."""
        plan = StepPlan(token_budget=self.config.max_num_batched_tokens,
                         may_draft=self.speculator is not None and self.speculator.begin_step(len(self.running)))
        preempted = self._schedule_running(plan)
        if not preempted:  # a step that had to preempt has no room to admit anyone
            self._admit_waiting(plan)
        output = SchedulerOutput(
            scheduled_new_reqs=plan.new_reqs,
            scheduled_cached_reqs=plan.cached,
            num_scheduled_tokens=plan.num_scheduled_tokens,
            total_num_scheduled_tokens=sum(plan.num_scheduled_tokens.values()),
            finished_req_ids=self.finished_req_ids,
            preempted_req_ids=self.preempted_req_ids,
            structured_output_request_ids=bitmask_rows(plan, self.requests),
            scheduled_spec_decode_tokens=plan.spec_token_ids,
        )
        self._advance_computed_tokens(plan.num_scheduled_tokens)
        return output

    def _schedule_running(self, plan: StepPlan) -> bool:
        """Give running requests (admitted earlier) their tokens first; True if KV ran out and
        running requests were preempted to make room."""
        preempted = False
        index = 0
        lazy_fills = self.structured_output_manager.lazy_fills if self.structured_output_manager is not None else None
        while index < len(self.running) and plan.token_budget > 0:
            request = self.running[index]
            num_new = min(request.num_tokens - request.num_computed_tokens, plan.token_budget)
            if num_new <= 0 or (lazy_fills is not None and lazy_fills.in_flight(request.request_id)):
                index += 1
                continue
            draft = self._draft(request, num_new, plan.token_budget - num_new) if plan.may_draft else []
            new_blocks = self.kv_cache_manager.allocate_slots(request, num_new + len(draft)) if draft else None
            if new_blocks is None:  # no draft, or no room for it: a draft never preempts anyone
                draft = []
                new_blocks, preempted_now = self._allocate_or_preempt(request, num_new)
                preempted |= preempted_now
                if new_blocks is None:
                    break
            if draft:
                plan.spec_token_ids[request.request_id] = draft
            plan.cached.req_ids.append(request.request_id)
            plan.cached.new_token_ids.append(request.take_forced_token_ids())
            plan.cached.new_block_ids.append([b.block_id for b in new_blocks])
            plan.cached.num_computed_tokens.append(request.num_computed_tokens)
            plan.add(request.request_id, num_new + len(draft))
            index += 1
        return preempted

    def _draft(self, request: Request, num_new: int, token_budget: int) -> list[int]:
        """Draft tokens to verify after `num_new` tokens of a running request, when they complete
        its catch-up (it samples this step); within the token budget and its room to grow (the
        token after the draft is the model's)."""
        speculator = self.speculator
        if speculator is None or request.num_computed_tokens + num_new != request.num_tokens:
            return []
        manager = self.structured_output_manager
        structured_output = request.structured_output
        return speculator.propose(
            request, min(token_budget, request.num_room_tokens(self.max_model_len) - 1), len(self.running),
            stop_at_forced=(manager is not None and structured_output is not None
                            and manager.jump_forward_enabled(structured_output)))

    def _allocate_or_preempt(self, request: Request, num_new: int) -> tuple[list[KVCacheBlock] | None, bool]:
        """KV slots for `num_new` more tokens of a running request, preempting the newest running
        requests until they fit: (blocks, whether anyone was preempted); (None, True) when
        `request` itself had to go."""
        preempted = False
        while True:
            new_blocks = self.kv_cache_manager.allocate_slots(request, num_new)
            if new_blocks is not None:
                return new_blocks, preempted
            victim = self.running.pop()  # KV full: the last running request (lowest priority, then newest)
            self._preempt(victim)
            preempted = True
            if victim is request:
                return None, True

    def _admit_waiting(self, plan: StepPlan) -> None:
        """Move waiting requests into `running` in (priority, arrival) order while the budget, the
        sequence cap and the KV blocks allow; a request whose grammar still compiles keeps its place
        without holding up the ones behind it."""
        skipped: list[Request] = []
        while self.waiting and plan.token_budget > 0:
            if len(self.running) >= self.config.max_num_seqs:
                break
            request = self.waiting[0]
            if request.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR:
                if not self._activate_grammar_or_finish(request):
                    if not request.is_finished:  # still compiling: nobody waits for it
                        skipped.append(self.waiting.pop(0))
                    continue
            hits, num_hit_tokens = self.kv_cache_manager.get_computed_blocks(request)
            num_new = request.num_tokens - num_hit_tokens
            # chunked prefill off: a prompt waits for a step with room for all of it, unless it is
            # longer than a whole step's budget (then it is chunked anyway, or it would never run)
            if (not self.config.enable_chunked_prefill
                    and plan.token_budget < num_new <= self.config.max_num_batched_tokens):
                break
            num_new = min(num_new, plan.token_budget)
            new_blocks = self.kv_cache_manager.allocate_slots(request, num_new, hits)
            if new_blocks is None:
                break
            self.waiting.pop(0)
            plan.new_reqs.append(self._start_running(request, num_hit_tokens))
            plan.add(request.request_id, num_new)
        for request in reversed(skipped):
            self.waiting.insert(0, request)

    def _start_running(self, request: Request, num_hit_tokens: int) -> NewRequestData:
        """Mark an admitted request running (its first `num_hit_tokens` come from the prefix cache)."""
        request.num_computed_tokens = num_hit_tokens
        if request.first_scheduled_time is None:
            request.first_scheduled_time = time.monotonic()
            request.counters.num_cached_tokens = num_hit_tokens  # prefix-cache hits at its first schedule
        request.status = RequestStatus.RUNNING
        request.take_forced_token_ids()  # new requests are sent in full
        insert_in_order(self.running, request)
        return NewRequestData(
            req_id=request.request_id,
            token_ids=list(request.all_token_ids),
            num_prompt_tokens=request.num_prompt_tokens,
            sampling_params=request.sampling_params,
            block_ids=self.kv_cache_manager.get_block_ids(request.request_id),
            num_computed_tokens=num_hit_tokens,
        )

    def _advance_computed_tokens(self, num_scheduled_tokens: dict[str, int]) -> None:
        """The plan is made: its tokens count as computed from now on, and a new step begins."""
        for req_id, num_new in num_scheduled_tokens.items():
            self.requests[req_id].num_computed_tokens += num_new
        self.finished_req_ids = set()
        self.preempted_req_ids = set()
        self.num_steps += 1

    def _preempt(self, request: Request) -> None:
        """Recompute-style preemption: drop the KV, keep the tokens (and the grammar state)."""
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.take_forced_token_ids()  # it is sent in full when it resumes
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.preempted_req_ids.add(request.request_id)
        self._enqueue_waiting(request)
        logger.debug("preempted %s", request.request_id)

    def _activate_grammar_or_finish(self, request: Request) -> bool:
        """True once the request's grammar is compiled (the request becomes WAITING). On a compile
        failure the request finishes with FINISHED_ERROR (its output queued) and this returns False,
        as it does while the grammar still compiles."""
        manager = self.structured_output_manager
        structured_output = request.structured_output
        assert manager is not None and structured_output is not None  # only constrained requests wait for a grammar
        try:
            ready = manager.try_activate(request.request_id, structured_output, request.sampling_params.max_tokens,
                                         self.max_model_len - request.num_tokens)
        except ValueError as e:  # compile failure: ends this request only
            self._fail_grammar(request, str(e))
            return False
        if ready:
            request.status = RequestStatus.WAITING
        return ready

    def get_grammar_bitmask(self, scheduler_output: SchedulerOutput) -> GrammarOutput | None:
        """Fill the bitmask rows of this step's constrained requests (CPU, beside the forward)."""
        rows = scheduler_output.structured_output_request_ids
        if not rows or self.structured_output_manager is None:
            return None
        grammar_output = self.structured_output_manager.fill_bitmask(
            [(req_id, self.requests[req_id].structured_output, row) for req_id, row in rows.items()],
            scheduler_output.scheduled_spec_decode_tokens)
        for req_id, error in grammar_output.failed.items():  # its sampled token will be dropped
            self._fail_grammar(self.requests[req_id], error)
        return grammar_output

    def finish_grammar_bitmask(self, grammar_output: GrammarOutput | None) -> None:
        """After the forward: the rows filled off the engine thread, in place. A request whose fill
        is still running skips this sample: its last token is computed again once its row is ready
        (it is not scheduled before), and the KV of that position is rewritten with the same values."""
        if grammar_output is None or self.structured_output_manager is None:
            return
        lazy = {req_id: self.requests[req_id].structured_output for req_id in grammar_output.lazy_req_ids}
        for req_id, error in self.structured_output_manager.finish_bitmask(grammar_output, lazy).items():
            self._fail_grammar(self.requests[req_id], error)
        for req_id in grammar_output.deferred:
            request = self.requests.get(req_id)
            if request is not None:
                request.rollback_computed_tokens(1)

    @property
    def num_waiting_for_fill(self) -> int:
        """Running requests held back while their grammar builds a state's mask off the engine thread."""
        manager = self.structured_output_manager
        return manager.lazy_fills.num_in_flight if manager is not None else 0

    def _fail_grammar(self, request: Request, error: str) -> None:
        """End a request whose grammar work failed or ran past a limit; only this request."""
        self._finish_with_error(request, ErrorKind.CONSTRAINT, error)
        self._pending_outputs.append(final_output(request, []))

    # ---- results -----------------------------------------------------------------------

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput | None) -> list[EngineCoreOutput]:
        """Append sampled tokens, advance grammars, apply stops and jump-forward, free KV."""
        outputs, self._pending_outputs = self._pending_outputs, []
        if runner_output is None:
            return outputs
        for req_id in runner_output.req_ids:
            request = self.requests.get(req_id)
            if request is None:  # aborted while the step ran
                continue
            request.counters.num_forward_passes += 1
            if req_id in runner_output.dead_end_req_ids:
                self._finish_with_error(request, ErrorKind.INTERNAL,
                                        "grammar dead end: no token is allowed at this position")
                outputs.append(final_output(request, []))
                continue
            sampled = runner_output.sampled_token_ids.get(req_id)
            if not sampled:
                continue  # mid-prompt: nothing to report yet
            num_draft = len(scheduler_output.scheduled_spec_decode_tokens.get(req_id, ()))
            if num_draft:
                self._verified(request, num_draft, len(sampled) - 1)
            try:
                new_token_ids, num_sampled = self.output_appender.take_sampled(request, sampled)
            except Exception as e:  # grammar work (accept, jump-forward) raised: ends this request only
                if not request.is_finished:
                    self._finish_with_error(request, ErrorKind.CONSTRAINT,
                                            grammar_failure("advancing over the output", e))
                    outputs.append(final_output(request, []))
                continue
            logprobs = runner_output.logprobs.get(req_id, [])[:num_sampled]
            outputs.append(final_output(request, new_token_ids, logprobs) if request.is_finished
                           else step_output(request, new_token_ids, logprobs))
        return outputs

    def _verified(self, request: Request, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """The request's draft was verified: counted, told to the speculator, and the KV of its
        rejected tokens discarded."""
        request.counters.num_draft_tokens += num_draft_tokens
        request.counters.num_accepted_draft_tokens += num_accepted_tokens
        assert self.speculator is not None  # only the speculator drafts
        self.speculator.record(request, num_draft_tokens, num_accepted_tokens)
        request.rollback_computed_tokens(num_draft_tokens - num_accepted_tokens)

