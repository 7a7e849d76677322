"""Runs the model runner off the engine thread, so grammar work overlaps the forward pass."""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from engine.sched.scheduler_output import ModelRunnerOutput, SchedulerOutput
from engine.structured_output.grammar_output import GrammarOutput
from engine.worker.model_runner import ModelRunner


class Executor:
    """One worker thread drives the runner; torch ops release the GIL while they compute."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="formwork-forward")

    def execute_model(self, scheduler_output: SchedulerOutput, non_block: bool = False) -> Future | None:
        """Start the forward. With non_block, returns a future resolving to None (logits parked)."""
        future = self._worker.submit(self.runner.execute_model, scheduler_output)
        return future if non_block else future.result()

    def sample_tokens(self, grammar_output: GrammarOutput | None) -> ModelRunnerOutput:
        return self.runner.sample_tokens(grammar_output)

    def shutdown(self) -> None:
        self._worker.shutdown(wait=True)
