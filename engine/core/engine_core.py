"""The engine core: requests in, one step at a time, outputs out. Never touches gRPC."""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from engine.capacity import check_context_length, check_kv_capacity
from engine.config import EngineConfig, model_eos_token_ids
from engine.core.executor import Executor
from engine.core.host_memory import HeapTrimmer, configure_host_memory
from engine.core.step_stats import StepStatsCollector
from engine.core.step_timer import StepTimer, StepTiming
from engine.model_files import resolve_model
from engine.protocol import (ConstraintReport, EngineCoreOutput, EngineCoreRequest, EngineStats, ErrorKind,
                             FinishReason, RequestCounters, StepStats)
from engine.sched.request import Request
from engine.sched.scheduler import Scheduler
from engine.sched.scheduler_output import SchedulerOutput
from engine.spec_decode.speculator import Speculator
from engine.structured_output.manager import StructuredOutputManager
from engine.worker.model_runner import ModelRunner
from grammar.constraint import Constraint

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, config: EngineConfig) -> None:
        # spin-waiting OpenMP threads slow the forward 10-20x when grammar work runs beside it
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        configure_host_memory(config.host_memory)  # before the first matmul: oneDNN reads its cache size once
        import torch
        from transformers import AutoConfig

        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.config = config
        self.model_dir: Path = resolve_model(config.model, config.quantization)
        hf_config = AutoConfig.from_pretrained(self.model_dir)
        model_len = int(getattr(hf_config, "max_position_embeddings", 2048))
        self.max_model_len = min(config.max_model_len or model_len, model_len)
        self.vocab_size = int(hf_config.vocab_size)
        self.eos_token_ids = model_eos_token_ids(self.model_dir)  # every id that ends a request (unless ignore_eos)
        self.eos_token_id = self.eos_token_ids[0] if self.eos_token_ids else None
        self.model_name = self.model_dir.name

        self.runner = ModelRunner(config, self.model_dir, hf_config, self.max_model_len)
        self.executor = Executor(self.runner)
        from grammar.selection import make_selecting_backend
        self.structured_output_manager = StructuredOutputManager(
            make_selecting_backend(str(self.model_dir), self.vocab_size, config.grammar), config.grammar)
        # the steps' timings, for the front end's metrics and benchmarks (None: not collected)
        self.step_stats = StepStatsCollector() if config.collect_stats else None
        self.speculator = Speculator(config.resolved_speculative, self.structured_output_manager.backend)
        self.scheduler = Scheduler(config.scheduler, config.cache, self.runner.num_blocks, self.max_model_len,
                                   self.structured_output_manager, self.speculator)
        self.heap_trimmer = HeapTrimmer(config.host_memory.trim_interval_s)

    # ---- requests ----------------------------------------------------------------------

    def validate_request(self, request: EngineCoreRequest) -> None:
        """Raise ValueError naming what is wrong with a request; nothing is changed."""
        num_prompt = len(request.prompt_token_ids)
        if num_prompt == 0:
            raise ValueError("the prompt is empty")
        check_context_length(num_prompt, self.max_model_len)
        bad = [t for t in request.prompt_token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids out of range [0, {self.vocab_size}): {bad[:5]}")
        request.sampling_params.validate(self.vocab_size)
        check_kv_capacity(num_prompt, request.sampling_params.max_tokens, self.max_model_len,
                          self.runner.num_blocks - 1, self.config.cache.block_size)  # less the null block
        if request.request_id in self.scheduler.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")

    def add_request(self, request: EngineCoreRequest) -> None:
        """Queue a request; an invalid one ends at once with an ERROR output (never raises)."""
        try:
            self.validate_request(request)
        except ValueError as e:
            self.scheduler.report(EngineCoreOutput(
                request.request_id, finish_reason=int(FinishReason.ERROR), error=str(e),
                error_kind=ErrorKind.INVALID_REQUEST,
                counters=RequestCounters(num_prompt_tokens=len(request.prompt_token_ids))))
            return
        self.scheduler.add_request(Request(
            request.request_id, request.prompt_token_ids, request.sampling_params, self.eos_token_ids,
            arrival_time=request.arrival_time or time.monotonic(), priority=request.priority))

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.abort_requests(request_ids)

    def fail_grammar_compiles(self, error: str) -> int:
        """End every request whose grammar is still compiling with an ERROR output saying `error`
        (the engine is short of memory, and a compile is grammar work that grows outside a step);
        returns how many. The compiles themselves run on: Python cannot stop a thread."""
        manager = self.structured_output_manager
        failing = [r for r in self.scheduler.waiting if manager.is_compiling(r.request_id)]
        self.scheduler.abort_requests([r.request_id for r in failing])
        for request in failing:
            self.scheduler.report(EngineCoreOutput(
                request.request_id, finish_reason=int(FinishReason.ERROR), error=error,
                error_kind=ErrorKind.MEMORY_SUSPECT,
                counters=RequestCounters(num_prompt_tokens=request.num_prompt_tokens)))
        return len(failing)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def outputs_delivered(self) -> None:
        """After the caller has handed on a step's outputs, the heap's free pages go back when the
        engine is idle (nothing left to run), or now and then while it is busy: no answer waits
        for a trim, and the forward is not allocating."""
        if self.has_unfinished_requests():
            self.heap_trimmer.maybe_trim()
        else:
            self.heap_trimmer.on_idle()

    # ---- the loop ----------------------------------------------------------------------

    def step(self) -> list[EngineCoreOutput]:
        with StepTimer(self._record_step) as timer:
            scheduler_output = self.scheduler.schedule()
            if scheduler_output.is_empty:
                return self._step_without_forward(scheduler_output)
            timer.launched(scheduler_output)
            future = self.executor.execute_model(scheduler_output, non_block=True)
            grammar_output = self.scheduler.get_grammar_bitmask(scheduler_output)  # overlaps the forward
            timer.filled()
            model_output = future.result()
            self.scheduler.finish_grammar_bitmask(grammar_output)  # the rows filled off this thread
            timer.waited()
            if model_output is None:
                model_output = self.executor.sample_tokens(grammar_output)
            timer.sampled()
            return self.scheduler.update_from_output(scheduler_output, model_output)

    def _step_without_forward(self, scheduler_output: SchedulerOutput) -> list[EngineCoreOutput]:
        """Nothing to compute: the runner still drops the rows of requests that finished or were
        preempted, and an engine that only waits on grammar work waits for it, not in a spin."""
        if scheduler_output.finished_req_ids or scheduler_output.preempted_req_ids:
            self.executor.execute_model(scheduler_output)
        if self.scheduler.num_waiting_for_grammar or self.scheduler.num_waiting_for_fill:
            self.structured_output_manager.wait_for_any(0.005)
        return self.scheduler.update_from_output(scheduler_output, None)

    def _record_step(self, timing: StepTiming) -> None:
        """Where every step's timing goes: the speculator's price of a row, and the metrics when
        they are collected. The price is what the step took, planning and drafting included: on
        CPU its threads' CPU time, which neither other processes on a shared machine nor their
        bursts change (its wall time does, by several times); on CUDA its wall time, which holds
        the device's."""
        timing.forward_s, timing.forward_cpu_s = self.runner.last_forward_s, self.runner.last_forward_cpu_s
        on_cpu = self.runner.device.type == "cpu"
        self.speculator.observe_step(timing.num_tokens, timing.busy_s if on_cpu else timing.wall_s)
        if self.step_stats is not None:
            self.step_stats.record_step(timing)

    # ---- calls -------------------------------------------------------------------------

    def get_stats(self) -> EngineStats:
        s = self.scheduler
        pool = s.kv_cache_manager.pool
        return EngineStats(
            num_running=len(s.running),
            num_waiting=len(s.waiting) - s.num_waiting_for_grammar,
            num_waiting_for_grammar=s.num_waiting_for_grammar,
            num_free_blocks=pool.num_free_blocks,
            num_total_blocks=pool.num_blocks - 1,
            num_cached_blocks=pool.num_cached_blocks,
            num_steps=s.num_steps,
            num_grammar_cache_hits=self.structured_output_manager.compiler.num_hits,
            num_grammar_compiles=self.structured_output_manager.compiler.num_misses,
        )

    def take_step_stats(self) -> StepStats | None:
        """What the steps since the last call measured, with the running totals (None: not collected)."""
        if self.step_stats is None:
            return None
        return self.step_stats.take(self.scheduler, self.structured_output_manager.compiler)

    def validate_constraint(self, constraint: Constraint) -> ConstraintReport:
        """Compile now (warming the cache) and report; never raises for a bad constraint."""
        try:
            constraint.validate()
            compiled, compile_s, cached = self.structured_output_manager.compiler.compile_sync(constraint)
        except ValueError as e:
            return ConstraintReport(ok=False, error=str(e))
        return ConstraintReport(ok=True, compile_s=compile_s, cached=cached,
                                not_enforced=list(compiled.not_enforced), backend=compiled.backend_name)

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (benchmarks: each run starts from the same cache state)."""
        self.scheduler.kv_cache_manager.pool.reset_prefix_cache()

    def shutdown(self) -> None:
        self.executor.shutdown()
        self.structured_output_manager.shutdown()
