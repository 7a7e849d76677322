"""A fake EngineCore for service tests: the real interface and lifecycle, no model, no torch.

Every request "generates" the tokens of a canned answer, one token per step (each step sleeps
`step_s`, standing in for the forward pass), then EOS. Constrained requests first wait for their
"grammar" (`compile_s`; a spec containing "slow" waits `slow_compile_s`) and a spec containing
"(unbalanced" fails to compile, like the real core: a FINISHED_ERROR output. KV blocks are
accounted like the real pool (a running request holds ceil(num_tokens / block_size)), so stats
show them freed on abort. A request with seed 666 makes the step raise (engine death).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.frontend.tokenizer import Tokenizer
from engine.protocol import (ConstraintReport, EngineCoreOutput, EngineCoreRequest, EngineStats, ErrorKind,
                             FinishReason, RequestCounters, StepStats, TokenLogprob)
from grammar.constraint import Constraint

CRASH_SEED = 666
PLAIN_ANSWER = "Hello from the fake engine, one token at a time."
JSON_ANSWER = json.dumps({"name": "Ada", "age": 36})


@dataclass
class _FakeRequest:
    request: EngineCoreRequest
    answer: list[int]
    grammar_ready_time: float = 0.0
    num_output_tokens: int = 0
    running: bool = False
    first_scheduled_time: float | None = None
    num_forward_passes: int = 0
    output_token_ids: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.request.prompt_token_ids) + self.num_output_tokens


class FakeEngineCore:
    def __init__(self, config: EngineConfig | None = None, *, model_dir: str | Path | None = None,
                 step_s: float = 0.01, compile_s: float = 0.0, slow_compile_s: float = 30.0,
                 startup_s: float = 0.0, max_model_len: int = 512) -> None:
        from engine.model_files import resolve_model
        time.sleep(startup_s)
        self.config = config or fake_config()
        self.model_dir = Path(model_dir) if model_dir else resolve_model(self.config.model)
        self.model_name = "fake-" + self.model_dir.name
        self.tokenizer = Tokenizer.from_model_dir(self.model_dir)
        self.vocab_size = self.tokenizer.vocab_size
        self.eos_token_id = self.tokenizer.eos_token_id
        self.max_model_len = max_model_len
        self.step_s, self.compile_s, self.slow_compile_s = step_s, compile_s, slow_compile_s
        self.block_size = self.config.cache.block_size
        self.num_total_blocks = self.config.cache.num_blocks or 64
        self.requests: dict[str, _FakeRequest] = {}
        self.pending: list[EngineCoreOutput] = []
        self.num_steps = 0
        self.aborted: list[str] = []  # every id abort_requests removed (tests look)
        self.step_stats = StepStats()  # steps since the last take_step_stats, like the real core's

    # ---- requests ----------------------------------------------------------------------------

    def add_request(self, request: EngineCoreRequest) -> None:
        params = request.sampling_params
        try:
            if not request.prompt_token_ids:
                raise ValueError("the prompt is empty")
            params.validate(self.vocab_size)
            if request.request_id in self.requests:
                raise ValueError(f"request id {request.request_id!r} is already in use")
        except ValueError as e:
            self.pending.append(EngineCoreOutput(request.request_id, finish_reason=int(FinishReason.ERROR),
                                                 error=str(e), error_kind=ErrorKind.INVALID_REQUEST))
            return
        constraint = params.constraint
        text = PLAIN_ANSWER
        if constraint is not None:
            text = constraint.choices[0] if constraint.kind == "choice" else JSON_ANSWER
        answer = self.tokenizer.encode(text, add_special_tokens=False) + [self.eos_token_id]
        fake = _FakeRequest(request, answer)
        if constraint is not None:
            delay = self.slow_compile_s if "slow" in constraint.spec else self.compile_s
            fake.grammar_ready_time = time.monotonic() + delay
        self.requests[request.request_id] = fake

    def abort_requests(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            if self.requests.pop(request_id, None) is not None:
                self.aborted.append(request_id)

    def fail_grammar_compiles(self, error: str) -> int:
        now = time.monotonic()
        failing = [r for r in self.requests.values() if not r.running and now < r.grammar_ready_time]
        for fake in failing:
            del self.requests[fake.request.request_id]
            self.pending.append(EngineCoreOutput(fake.request.request_id, finish_reason=int(FinishReason.ERROR),
                                                 error=error, error_kind=ErrorKind.MEMORY_SUSPECT))
        return len(failing)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or bool(self.pending)

    # ---- the loop ----------------------------------------------------------------------------

    def outputs_delivered(self) -> None:
        """The real core trims its heap here when idle; the fake has none."""

    def step(self) -> list[EngineCoreOutput]:
        outputs, self.pending = self.pending, []
        now = time.monotonic()
        self._schedule(now)
        running = [r for r in self.requests.values() if r.running]
        if not running:
            time.sleep(0.002)  # idle on a compile, not in a spin
            return outputs
        started = time.perf_counter()
        time.sleep(self.step_s)  # the "forward pass"
        self.num_steps += 1
        forward_s = time.perf_counter() - started
        for column, value in ((self.step_stats.num_reqs, len(running)), (self.step_stats.num_tokens, len(running)),
                              (self.step_stats.num_bitmask_rows, 0), (self.step_stats.forward_s, forward_s),
                              (self.step_stats.fill_s, 0.0), (self.step_stats.wait_s, forward_s),
                              (self.step_stats.sample_s, 0.0), (self.step_stats.total_s, forward_s)):
            column.append(value)
        for fake in running:
            if fake.request.sampling_params.seed == CRASH_SEED:
                raise RuntimeError("fake engine crash (seed 666)")
            fake.num_forward_passes += 1
            token_id = fake.answer[fake.num_output_tokens % len(fake.answer)]
            fake.num_output_tokens += 1
            fake.output_token_ids.append(token_id)
            output = EngineCoreOutput(fake.request.request_id, [token_id])
            params = fake.request.sampling_params
            if params.logprobs is not None:
                output.new_logprobs = [TokenLogprob(token_id, -0.25, [(token_id, -0.25)] * params.logprobs)]
            finish = self._finish_reason(fake, token_id)
            if finish is not None:
                del self.requests[fake.request.request_id]
                output = self._final(fake, output, finish, token_id)
            outputs.append(output)
        return outputs

    def _schedule(self, now: float) -> None:
        num_running = sum(r.running for r in self.requests.values())
        waiting = sorted((r for r in self.requests.values() if not r.running),
                         key=lambda r: (r.request.priority, r.request.arrival_time))
        for fake in waiting:
            constraint = fake.request.sampling_params.constraint
            if constraint is not None and now < fake.grammar_ready_time:
                continue  # waiting for its grammar
            if constraint is not None and "(unbalanced" in constraint.spec:
                del self.requests[fake.request.request_id]
                self.pending.append(EngineCoreOutput(
                    fake.request.request_id, finish_reason=int(FinishReason.ERROR),
                    error="regex: missing closing parenthesis at position 0", error_kind=ErrorKind.CONSTRAINT,
                    counters=RequestCounters(num_prompt_tokens=len(fake.request.prompt_token_ids))))
                continue
            if num_running >= self.config.scheduler.max_num_seqs or \
                    self._blocks_of(fake.num_tokens + 1) > self.num_free_blocks:
                continue
            fake.running = True
            fake.first_scheduled_time = now
            num_running += 1

    def _finish_reason(self, fake: _FakeRequest, token_id: int) -> FinishReason | None:
        params = fake.request.sampling_params
        if (token_id == self.eos_token_id and not params.ignore_eos) or token_id in params.stop_token_ids:
            return FinishReason.STOP
        if fake.num_output_tokens >= params.max_tokens or fake.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None

    def _final(self, fake: _FakeRequest, output: EngineCoreOutput, finish: FinishReason,
               token_id: int) -> EngineCoreOutput:
        arrival = fake.request.arrival_time
        stop_reason = token_id if finish == FinishReason.STOP else None
        counters = RequestCounters(
            num_prompt_tokens=len(fake.request.prompt_token_ids), num_forward_passes=fake.num_forward_passes,
            queued_s=max((fake.first_scheduled_time or arrival) - arrival, 0.0),
            grammar_wait_s=max(fake.grammar_ready_time - arrival, 0.0) if fake.grammar_ready_time else 0.0)
        return msgspec.structs.replace(output, finish_reason=int(finish), stop_reason=stop_reason, counters=counters)

    # ---- calls -------------------------------------------------------------------------------

    def _blocks_of(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.block_size)

    @property
    def num_free_blocks(self) -> int:
        return self.num_total_blocks - sum(self._blocks_of(r.num_tokens) for r in self.requests.values() if r.running)

    def take_step_stats(self) -> StepStats:
        stats, self.step_stats = self.step_stats, StepStats()
        stats.num_steps = self.num_steps
        return stats

    def get_stats(self) -> EngineStats:
        running = sum(r.running for r in self.requests.values())
        now = time.monotonic()
        for_grammar = sum(not r.running and r.request.sampling_params.constraint is not None
                          and now < r.grammar_ready_time for r in self.requests.values())
        return EngineStats(num_running=running, num_waiting=len(self.requests) - running - for_grammar,
                           num_waiting_for_grammar=for_grammar, num_free_blocks=self.num_free_blocks,
                           num_total_blocks=self.num_total_blocks, num_steps=self.num_steps)

    def validate_constraint(self, constraint: Constraint) -> ConstraintReport:
        try:
            constraint.validate()
        except ValueError as e:
            return ConstraintReport(ok=False, error=str(e))
        if "(unbalanced" in constraint.spec:
            return ConstraintReport(ok=False, error="regex: missing closing parenthesis at position 0")
        return ConstraintReport(ok=True, compile_s=0.001)

    def shutdown(self) -> None:
        pass


def fake_config(max_num_seqs: int = 4, max_num_waiting: int = 4, num_blocks: int = 64) -> EngineConfig:
    return EngineConfig(scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_waiting=max_num_waiting),
                        cache=CacheConfig(num_blocks=num_blocks))


def make_fake_core(config: EngineConfig) -> FakeEngineCore:
    """A picklable core factory for AsyncMPClient (runs in the spawned engine process)."""
    return FakeEngineCore(config)
