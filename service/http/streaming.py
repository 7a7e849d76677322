"""Several generations consumed as one stream, and server-sent events.

`merged` serves `n` choices (and several prompts) of one HTTP request: outputs come in the order
the engine produces them, tagged with their choice's index. Closing it early (the client went
away) closes every generation, which aborts each in the engine and frees its KV blocks.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from engine.frontend.output_processor import RequestOutput

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
