"""The server's batch worker: runs the store's unfinished batches, oldest first, one at a time,
in the background of the server's event loop.

A batch's lines go through the job runner (service/batch/runner.py) to an Executor that answers
them at the batch priority, `max_concurrent_lines` at a time, so interactive requests keep the
engine's attention. Answers are appended to the batch's results file as they come and its
request counts follow in the store. A server stopped or killed mid-batch finds it `in_progress`
on its next start and resumes it from its results file: a line already answered is never sent
again. Cancelling stops the batch at once (its requests in flight are aborted) and keeps what was
answered; so does the end of the completion window (`expired`).
"""
from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

from service.batch.api_config import BatchApiConfig
from service.batch.batch_input import check_input, read_input
from service.batch.batch_results import CANCELLED, EXPIRED, Unrun, is_success, split_results
from service.batch.batch_status import CANCELLABLE, BatchStatus
from service.batch.executor import Executor
from service.batch.lines import RequestLine, output_key
from service.batch.output_file import OutputFile
from service.batch.progress import Progress, ProgressCounts
from service.batch.runner import JobRunner
from service.batch.store import BatchStore, RequestCounts, StoredBatch

logger = logging.getLogger(__name__)


class BatchWorker:
    """`is_ready` says whether the engine serves; a batch waits for it before it runs."""

    def __init__(self, store: BatchStore, executor: Executor, config: BatchApiConfig, is_ready: Callable[[], bool],
                 *, ready_poll_s: float = 0.5, retry_backoff_s: float = 1.0) -> None:
        self._store = store
        self._executor = executor
        self._config = config
        self._is_ready = is_ready
        self._ready_poll_s = ready_poll_s
        self._retry_backoff_s = retry_backoff_s
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._running: tuple[str, asyncio.Task[None]] | None = None  # (batch id, the task running its lines)

    def start(self) -> None:
        """Start working through the store, from the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self._work(), name="batch-worker")

    async def stop(self) -> None:
        """Stop: the lines in flight are aborted, and run again when a worker resumes the batch."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    def wake(self) -> None:
        """Look at the store again (a batch was created or cancelled)."""
        self._wake.set()

    async def validate(self, batch: StoredBatch) -> StoredBatch:
        """Check a `validating` batch's input: `in_progress` with its request count, or `failed`
        with the problems. The file is read on a thread."""
        path = self._store.file_path(batch.input_file_id)
        checked = await asyncio.to_thread(check_input, path, batch.endpoint, self._config.max_requests)
        current = self._store.batch(batch.id)
        if current is None or current.status is not BatchStatus.VALIDATING:
            return current or batch  # validated meanwhile by the other caller, or cancelled
        if checked.errors:
            logger.info("batch %s failed validation: %s", batch.id, checked.errors[0]["message"])
            return self._store.move(batch.id, BatchStatus.FAILED, errors=checked.errors)
        return self._store.move(batch.id, BatchStatus.IN_PROGRESS, num_total=len(checked.requests))

    def cancel(self, batch_id: str) -> StoredBatch:
        """Start cancelling a batch: `cancelling` now, `cancelled` once its answers are written.
        KeyError for an unknown batch; ValueError for one that can no longer be cancelled."""
        batch = self._store.batch(batch_id)
        if batch is None:
            raise KeyError(batch_id)
        if batch.status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
            return batch
        if batch.status not in CANCELLABLE:
            raise ValueError(f"the batch {batch_id} is {batch.status.value}; only a validating or in_progress "
                             f"batch can be cancelled")
        batch = self._store.move(batch_id, BatchStatus.CANCELLING)
        if self._running is not None and self._running[0] == batch_id:
            self._running[1].cancel()
        self.wake()
        return batch

    # ---- the loop -------------------------------------------------------------------------------

    async def _work(self) -> None:
        while True:
            self._wake.clear()
            for batch in self._store.unfinished_batches():
                try:
                    await self._advance(batch)
                except asyncio.CancelledError:
                    raise
                except Exception:  # one batch's failure (a full disk) must not stop the others
                    logger.exception("batch %s: its work failed; retried when the worker next looks at the store",
                                     batch.id)
            await self._wake.wait()

    async def _advance(self, batch: StoredBatch) -> None:
        current = self._store.batch(batch.id)  # it may have moved since it was listed
        if current is None or current.status.is_finished:
            return
        if current.status is BatchStatus.VALIDATING:
            current = await self.validate(current)
        if current.status is BatchStatus.IN_PROGRESS:
            await self._run(current)  # no await since the status was read: a cancel sees the job
            current = self._store.batch(batch.id)
            assert current is not None
            if current.status is BatchStatus.IN_PROGRESS:  # every line answered
                current = self._store.move(batch.id, BatchStatus.FINALIZING)
        if current.status is BatchStatus.CANCELLING:
            await self._finish(current, BatchStatus.CANCELLED, CANCELLED)
        elif current.status is BatchStatus.FINALIZING:
            await self._finish(current, BatchStatus.COMPLETED, None)

    async def _run(self, batch: StoredBatch) -> None:
        """Answer the batch's lines not yet in its results file, until every line is answered, the
        batch is cancelled (its status says so) or its window ends (then it is finished `expired`)."""
        job = asyncio.get_running_loop().create_task(self._answer_all(batch))
        self._running = (batch.id, job)
        try:
            await asyncio.wait({job}, timeout=max(0.0, batch.expires_at - time.time()))
        except asyncio.CancelledError:  # the worker stops: so do the batch's lines
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job
            raise
        finally:
            self._running = None
        if not job.done():
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job
            logger.info("batch %s expired before its end", batch.id)
            await self._finish(batch, BatchStatus.EXPIRED, EXPIRED)
        elif not job.cancelled():
            job.result()  # raises what failed it

    async def _answer_all(self, batch: StoredBatch) -> None:
        requests = await asyncio.to_thread(_requests, self._store.file_path(batch.input_file_id))
        results = self._store.results_path(batch.id)
        base = await asyncio.to_thread(_counts_in, results)
        with OutputFile(results, output_key) as output:
            if output.done:
                logger.info("batch %s resumed: %d of its %d requests were answered before", batch.id,
                            len(output.done), len(requests))
            while True:
                await self._engine_ready()
                progress = _StoreProgress(self._store, batch.id, base)
                runner = JobRunner(self._executor, output, progress, concurrency=self._config.max_concurrent_lines)
                result = await runner.run(requests)
                if result.stopped is None:
                    return
                base = RequestCounts(base.total, base.completed + progress.num_done - progress.num_failed,
                                     base.failed + progress.num_failed)
                logger.warning("batch %s paused: %s; it goes on once the engine serves again", batch.id,
                               result.stopped)
                await asyncio.sleep(self._retry_backoff_s)

    async def _engine_ready(self) -> None:
        while not self._is_ready():
            await asyncio.sleep(self._ready_poll_s)

    async def _finish(self, batch: StoredBatch, status: BatchStatus, unrun: Unrun | None) -> None:
        """Split the batch's answers into its output and error files and end it in `status`."""
        requests = await asyncio.to_thread(_requests, self._store.file_path(batch.input_file_id))
        output, error = self._store.staged_path(), self._store.staged_path()
        split = await asyncio.to_thread(split_results, self._store.results_path(batch.id), requests, output, error,
                                        unrun)
        for path, num_lines in ((output, split.num_output_lines), (error, split.num_error_lines)):
            if not num_lines:
                path.unlink()
        finished = self._store.finish(batch.id, status, output if split.num_output_lines else None,
                                      error if split.num_error_lines else None, split.counts,
                                      split.usage.as_openai())
        logger.info("batch %s %s: %d answered, %d failed of %d", batch.id, status.value,
                    finished.request_counts.completed, finished.request_counts.failed, finished.request_counts.total)


class _StoreProgress(Progress):
    """The runner's counts kept in the store as lines are written (over those of earlier runs); no display."""

    def __init__(self, store: BatchStore, batch_id: str, base: RequestCounts) -> None:
        super().__init__(io.StringIO(), batch_id, is_tty=False)
        self._store = store
        self._batch_id = batch_id
        self._base = base

    def start(self, num_total: int, num_skipped: int) -> None:
        self.num_total, self.num_skipped = num_total, num_skipped

    def line_written(self, failed: bool, num_tokens: int) -> None:
        super().line_written(failed, num_tokens)
        self._store.set_counts(self._batch_id, self._base.completed + self.num_done - self.num_failed,
                               self._base.failed + self.num_failed)

    async def finish(self, stopped: str | None = None) -> ProgressCounts:
        return self.counts()


def _requests(path: Path) -> list[RequestLine]:
    """A validated input file's requests."""
    return [line for line in read_input(path) if isinstance(line, RequestLine)]


def _counts_in(results: Path) -> RequestCounts:
    """Answered and failed lines already in a results file (complete lines only)."""
    completed = failed = 0
    if results.exists():
        with open(results, "rb") as lines:
            for raw in lines:
                if not raw.endswith(b"\n"):
                    continue
                with contextlib.suppress(ValueError):
                    record = json.loads(raw)
                    if isinstance(record, dict) and is_success(record):
                        completed += 1
                    else:
                        failed += 1
    return RequestCounts(0, completed, failed)
