"""Several generations consumed as one stream, server-sent events, and the client's connection.

`merged` serves `n` choices (and several prompts) of one HTTP request: outputs come in the order
the engine produces them, tagged with their choice's index. Closing it early (the client went
away) closes every generation, which aborts each in the engine and frees its KV blocks;
`unless_disconnected` does that for a whole answer whose client went away.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

if TYPE_CHECKING:
    from starlette.requests import Request

    from engine.frontend.output_processor import RequestOutput

T = TypeVar("T")

DONE_EVENT = b"data: [DONE]\n\n"
_encoder = msgspec.json.Encoder()


def event(data: dict[str, Any]) -> bytes:
    """One server-sent event carrying `data` as JSON."""
    return b"data: " + _encoder.encode(data) + b"\n\n"


def encode_json(data: dict[str, Any]) -> bytes:
    return _encoder.encode(data)


async def merged(generations: Sequence[AsyncGenerator[RequestOutput, None]]
                 ) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(index, output) from every generation as each is produced; an exception in one is raised
    here, and ending early (or an exception) closes all of them."""
    if len(generations) == 1:  # the common case, without tasks
        async with contextlib.aclosing(generations[0]) as only:
            async for output in only:
                yield 0, output
        return
    queue: asyncio.Queue[tuple[int, RequestOutput | None, BaseException | None]] = asyncio.Queue()

    async def pump(index: int, generation: AsyncGenerator[RequestOutput, None]) -> None:
        try:
            async for output in generation:
                queue.put_nowait((index, output, None))
        except Exception as e:  # noqa: BLE001 - handed to the consumer, which raises it
            queue.put_nowait((index, None, e))
            return
        queue.put_nowait((index, None, None))

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(generations)]
    try:
        remaining = len(tasks)
        while remaining:
            index, output, error = await queue.get()
            if error is not None:
                raise error
            if output is None:
                remaining -= 1
                continue
            yield index, output
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for generation in generations:
            await generation.aclose()


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """`work`'s result, or None (work cancelled) if the client disconnects first: a non-streaming
    answer nobody will read must not keep its batch slot and KV blocks until max_tokens."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None
    return task.result()


async def _disconnect(request: Request) -> None:
    """Returns when the ASGI server reports the client gone (the body has been read already, so the
    next message on the channel is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def releasing(body: AsyncIterator[Any], release: Callable[[], None]) -> AsyncIterator[Any]:
    try:
        async for chunk in body:
            yield chunk
    finally:
        release()
