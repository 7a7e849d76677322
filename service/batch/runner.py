"""A job: every line of its input run through an Executor, `concurrency` at a time, each answer
written to the output file as soon as it comes (in the order answers come, not the input's).

Lines whose key is already in the output (a resumed job) are skipped; a line that cannot be sent
is written as its error record at once. An answer the executor says is "not now" (429, 503, or
ExecutorUnavailable) is retried with backoff and never written; when the retries run out the job
stops, and run again it picks up where it stopped.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from service.batch.executor import RETRYABLE_STATUSES, Executor, ExecutorUnavailable
from service.batch.lines import LineError, LineKey, RequestLine, answer_line, error_line, output_key
from service.batch.output_file import KeyOf, OutputFile
from service.batch.progress import Progress, ProgressCounts

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecordFormat:
    """What a job writes for each line, and how it reads a written record's key back."""

    answer: Callable[[RequestLine, int, dict[str, Any]], dict[str, Any]]  # (line, status, body) -> record
    error: Callable[[LineError], dict[str, Any]]
    key_of: KeyOf


# OpenAI's batch output lines (service/batch/lines.py)
BATCH_RECORDS = RecordFormat(lambda line, status, body: answer_line(line.custom_id, status, body), error_line,
                             output_key)


@dataclass(frozen=True)
class JobResult:
    counts: ProgressCounts
    stopped: str | None  # why the job stopped before its end (rerun it to resume); None: it ran to the end


class JobStopped(Exception):
    """An executor stayed unavailable through every retry."""


def generated_tokens(body: dict[str, Any]) -> int:
    """The tokens an answer generated, from its usage (0 for an error body)."""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return 0
    tokens = usage.get("completion_tokens", usage.get("output_tokens", 0))
    return tokens if isinstance(tokens, int) else 0


class JobRunner:
    def __init__(self, executor: Executor, output: OutputFile, progress: Progress, *,
                 records: RecordFormat = BATCH_RECORDS, concurrency: int | None = None, max_retries: int = 5,
                 retry_backoff_s: float = 1.0) -> None:
        """`concurrency`: requests in flight at once (default: the executor's preferred number);
        `max_retries`: tries after the first of a "not now" answer, `retry_backoff_s` doubling."""
        concurrency = executor.preferred_concurrency if concurrency is None else concurrency
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.executor = executor
        self.output = output
        self.progress = progress
        self.records = records
        self.concurrency = concurrency
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s

    async def run(self, lines: list[RequestLine | LineError]) -> JobResult:
        """Run every line not yet in the output; the output is synced before this returns."""
        todo = [line for line in lines if line.key not in self.output.done]
        self.progress.start(len(todo), len(lines) - len(todo))
        for line in todo:
            if isinstance(line, LineError):
                self._write(line.key, self.records.error(line), failed=True, num_tokens=0)
        requests = iter([line for line in todo if isinstance(line, RequestLine)])
        stopped = None
        workers = [asyncio.create_task(self._work(requests)) for _ in range(self.concurrency)]
        try:
            await asyncio.gather(*workers)
        except JobStopped as e:
            stopped = str(e)
        finally:  # a stop (or an error writing) abandons the requests in flight: they run again on resume
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            self.output.sync()
            self.progress.stop_showing()
        counts = await self.progress.finish(stopped)
        return JobResult(counts, stopped)

    async def _work(self, requests: Iterator[RequestLine]) -> None:
        # the shared iterator hands each line to one worker (no await between next() calls)
        for line in requests:
            status, body = await self._answer(line)
            self._write(line.key, self.records.answer(line, status, body), failed=status != 200,
                        num_tokens=generated_tokens(body))

    async def _answer(self, line: RequestLine) -> tuple[int, dict[str, Any]]:
        for attempt in range(self.max_retries + 1):
            try:
                status, body = await self.executor.execute(line.url, line.body)
                if status not in RETRYABLE_STATUSES:
                    return status, body
                reason = f"{status}: {(body.get('error') or {}).get('message', body)}"
            except ExecutorUnavailable as e:
                reason = str(e)
            if attempt == self.max_retries:
                raise JobStopped(f"{line.custom_id!r} was refused {attempt + 1} times, last with {reason}")
            delay = self.retry_backoff_s * 2 ** attempt
            logger.info("%s: %s; retrying in %.1f s", line.custom_id, reason, delay)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # the loop returns or raises

    def _write(self, key: LineKey, record: dict[str, Any], failed: bool, num_tokens: int) -> None:
        self.output.append(key, record)  # read_lines gave each key to one line, so never twice
        self.progress.line_written(failed, num_tokens)
