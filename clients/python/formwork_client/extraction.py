"""Extraction from many documents: each document one schema-constrained Generate call (the request
extract() sends), at most `concurrency` of them in flight, transient failures retried with
exponential backoff and jitter, and every document's outcome a result: a failed document's error
is in its result, never raised.

Client.extract_many runs the calls on a pool of threads (the sync channel is thread-safe),
AsyncClient.extract_many on asyncio tasks; everything else, the documents, the requests, the
retry rule, the results and the progress count, is here once.
"""
from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, NamedTuple

from formwork_client._gen.formwork.v1 import generation_pb2 as pb
from formwork_client.constraints import to_constraint
from formwork_client.errors import FormworkError, IncompleteOutputError, is_transient
from formwork_client.request import extract_request, extraction_result

# a document: its text, an (id, text) pair, or a mapping with "text" and, optionally, "id"
DocumentLike = str | tuple[Any, str] | Mapping[str, Any]
# (done, total, failed), called as each document finishes; `done` counts the failed ones too
ProgressCallback = Callable[[int, int, int], None]
_uniform = random.random  # the retry delay's jitter, looked up at each use (tests fix it)


class Usage(NamedTuple):
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class ExtractionResult:
    """One document's outcome."""

    index: int  # the document's position in the input
    id: Any  # the document's id as given; None for a plain string
    value: Any  # the parsed JSON (a dict for an object schema); None when `error` is set
    text: str  # the output text: the JSON as generated, or as much as there was; "" when no answer came
    usage: Usage  # the answered call's tokens; zeros when no answer came
    # None when it worked; else a StatusError (its .code, a grpc.StatusCode, and the server's .message)
    # for a failed call, or IncompleteOutputError when the output ended before the JSON was complete
    error: FormworkError | None
    attempts: int  # calls sent for this document: 1 + retries

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class RetryPolicy:
    """A transient failure (errors.is_transient: UNAVAILABLE, or RESOURCE_EXHAUSTED from an
    overloaded server) is sent again, at most `max_retries` times, after a delay drawn uniformly
    from [0, min(max_backoff_s, backoff_s * 2**retry)]: exponential, with full jitter so documents
    refused together do not come back together; never sooner than the delay the server asked for.
    Any other failure is final."""

    max_retries: int = 4
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ValueError(f"max_retries must be an integer >= 0, got {self.max_retries!r}")
        for name in ("backoff_s", "max_backoff_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0 seconds, got {getattr(self, name)!r}")

    def delay_s(self, error: FormworkError, num_retries: int,
                uniform: Callable[[], float] | None = None) -> float | None:
        """Seconds to wait before sending the call again after `error`, when `num_retries` retries
        were made already; None: give up. `uniform` draws the jitter from [0, 1) (default: random)."""
        if num_retries >= self.max_retries or not is_transient(error):
            return None
        backoff = (uniform or _uniform)() * min(self.max_backoff_s, self.backoff_s * 2 ** num_retries)
        return max(backoff, getattr(error, "retry_after_s", None) or 0.0)


class Document(NamedTuple):
    id: Any
    text: str


def to_documents(documents: Iterable[DocumentLike]) -> list[Document]:
    """The documents as (id, text); raises TypeError naming the first one that is none of the shapes."""
    if isinstance(documents, (str, bytes, Mapping)):
        raise TypeError(f"documents must be a list of documents, not one {type(documents).__name__}")
    out = []
    for index, document in enumerate(documents):
        if isinstance(document, str):
            out.append(Document(None, document))
        elif isinstance(document, Mapping) and isinstance(document.get("text"), str):
            out.append(Document(document.get("id"), document["text"]))
        elif isinstance(document, tuple) and len(document) == 2 and isinstance(document[1], str):
            out.append(Document(*document))
        else:
            raise TypeError(f"documents[{index}]: expected a string, an (id, text) pair or a mapping with a string "
                            f"'text' (and an 'id'), got {type(document).__name__}")
    return out


class ExtractionJob:
    """The documents of one extract_many call, their requests, and the count of those finished.

    Results are made by answered() and failed() (on any thread); record() counts one and calls
    on_progress, always from the caller's thread (or event loop), one result at a time."""

    def __init__(self, documents: Iterable[DocumentLike], schema: Mapping[str, Any] | str, *,
                 instructions: str | None, concurrency: int, retry: RetryPolicy,
                 on_progress: ProgressCallback | None, options: Mapping[str, Any]) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
        if "request_id" in options:
            raise TypeError("extract_many takes no request_id: each document is a request of its own")
        to_constraint(schema)  # a schema of the wrong type is refused before anything is sent
        self.documents = to_documents(documents)
        self.requests = [extract_request(schema, d.text, instructions, **options) for d in self.documents]
        self.concurrency = concurrency
        self.retry = retry
        self.num_done = 0
        self.num_failed = 0
        self.stopped = threading.Event()  # the caller stopped reading: send nothing more
        self._on_progress = on_progress

    @property
    def num_documents(self) -> int:
        return len(self.documents)

    def answered(self, index: int, response: pb.GenerateResponse, attempts: int) -> ExtractionResult:
        document = self.documents[index]
        usage = Usage(response.usage.prompt_tokens, response.usage.completion_tokens)
        try:
            value, error = extraction_result(response), None
        except IncompleteOutputError as e:
            value, error = None, e
        return ExtractionResult(index, document.id, value, response.text, usage, error, attempts)

    def failed(self, index: int, error: FormworkError, attempts: int) -> ExtractionResult:
        return ExtractionResult(index, self.documents[index].id, None, "", Usage(0, 0), error, attempts)

    def record(self, result: ExtractionResult) -> None:
        self.num_done += 1
        self.num_failed += not result.ok
        if self._on_progress is not None:
            self._on_progress(self.num_done, self.num_documents, self.num_failed)


# ---- on threads (Client) ------------------------------------------------------------------------


def run_on_threads(job: ExtractionJob, generate: Callable[[pb.GenerateRequest], pb.GenerateResponse]
                   ) -> Iterator[ExtractionResult]:
    """The results as they complete, `generate` called from job.concurrency threads. Closing the
    iterator early sends nothing more; it returns once the calls in flight have ended."""
    if not job.documents:
        return
    with ThreadPoolExecutor(max_workers=job.concurrency, thread_name_prefix="formwork-extract") as pool:
        futures = [pool.submit(_extract_on_thread, job, index, generate) for index in range(job.num_documents)]
        try:
            for future in as_completed(futures):
                result = future.result()
                job.record(result)
                yield result
        finally:
            job.stopped.set()
            for future in futures:
                future.cancel()


def _extract_on_thread(job: ExtractionJob, index: int,
                       generate: Callable[[pb.GenerateRequest], pb.GenerateResponse]) -> ExtractionResult:
    num_retries = 0
    while True:
        try:
            return job.answered(index, generate(job.requests[index]), num_retries + 1)
        except FormworkError as error:
            delay = job.retry.delay_s(error, num_retries)
            if delay is None or job.stopped.wait(delay):  # wait() is True when the caller stopped reading
                return job.failed(index, error, num_retries + 1)
            num_retries += 1


def in_input_order(job: ExtractionJob, results: Iterator[ExtractionResult]) -> list[ExtractionResult]:
    by_index = {result.index: result for result in results}
    return [by_index[index] for index in range(job.num_documents)]


# ---- on asyncio tasks (AsyncClient) -------------------------------------------------------------


async def run_on_tasks(job: ExtractionJob, generate: Callable[[pb.GenerateRequest], Awaitable[pb.GenerateResponse]]
                       ) -> AsyncGenerator[ExtractionResult, None]:
    """The results as they complete, from job.concurrency tasks that each take the next document.
    Closing the iterator early (aclose) cancels the calls in flight, which cancels them on the server."""
    finished: asyncio.Queue[ExtractionResult | Exception] = asyncio.Queue()
    indices = iter(range(job.num_documents))  # shared: each task takes the next index

    async def worker() -> None:
        try:
            for index in indices:
                finished.put_nowait(await _extract_on_task(job, index, generate))
        except Exception as e:  # a bug, not a failed call (those are results): the reader raises it
            finished.put_nowait(e)

    workers = [asyncio.create_task(worker()) for _ in range(min(job.concurrency, job.num_documents))]
    try:
        for _ in range(job.num_documents):
            result = await finished.get()
            if isinstance(result, Exception):
                raise result
            job.record(result)
            yield result
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)


async def _extract_on_task(job: ExtractionJob, index: int,
                           generate: Callable[[pb.GenerateRequest], Awaitable[pb.GenerateResponse]]
                           ) -> ExtractionResult:
    num_retries = 0
    while True:
        try:
            return job.answered(index, await generate(job.requests[index]), num_retries + 1)
        except FormworkError as error:
            delay = job.retry.delay_s(error, num_retries)
            if delay is None:
                return job.failed(index, error, num_retries + 1)
            await asyncio.sleep(delay)
            num_retries += 1


async def in_input_order_async(job: ExtractionJob, results: AsyncGenerator[ExtractionResult, None]
                               ) -> list[ExtractionResult]:
    async with contextlib.aclosing(results):
        by_index = {result.index: result async for result in results}
    return [by_index[index] for index in range(job.num_documents)]
