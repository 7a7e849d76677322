"""The batch worker's Executor on the HTTP server: each line answered by the routes' own Answerer,
at the batch priority, so a line gets exactly what a POST of its body would.

A line that was in flight when the engine died gets a strike. A struck line is sent again alone
(no other line in the engine with it), so that a second death names the line that causes it; at
two strikes it is answered 500 instead of being sent again. Retrying a request that crashes the
engine would otherwise take the server down: the supervisor restarts the engine a few times in a
row, then gives up.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from service.batch.executor import Executor
from service.http.errors import HttpError

if TYPE_CHECKING:
    from service.http.answerer import Answerer

MAX_STRIKES = 2  # engine deaths a line may be in flight at


class AnswererExecutor(Executor):
    """`is_ready` says whether the engine serves: a 503 while it did means it died under the line."""

    def __init__(self, answerer: Answerer, priority: int, is_ready: Callable[[], bool]) -> None:
        self._answerer = answerer
        self._priority = priority  # replaces a line's own formwork.priority
        self._is_ready = is_ready
        self._strikes: dict[str, int] = {}  # url and body -> engine deaths it was in flight at
        self._num_in_flight = 0
        self._alone = False  # a struck line runs: nothing else starts
        self._changed = asyncio.Condition()

    async def execute(self, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        key = url + json.dumps(body, sort_keys=True)
        strikes = self._strikes.get(key, 0)
        if strikes >= MAX_STRIKES:
            return _struck_out(strikes)
        async with self._changed:
            await self._changed.wait_for(lambda: not self._alone)
            if strikes:  # start none beside this one, and wait for the lines in flight to end
                self._alone = True
                try:
                    await self._changed.wait_for(lambda: self._num_in_flight == 0)
                except BaseException:  # cancelled while waiting
                    self._alone = False
                    self._changed.notify_all()
                    raise
            self._num_in_flight += 1
        try:
            was_serving = self._is_ready()
            answer = await self._answerer.answer(url, body, priority=self._priority)
        finally:
            async with self._changed:
                self._num_in_flight -= 1
                if strikes:
                    self._alone = False
                self._changed.notify_all()
        if answer.status_code == 503 and was_serving:
            self._strikes[key] = strikes + 1
            if strikes + 1 >= MAX_STRIKES:
                return _struck_out(strikes + 1)
        return answer.status_code, answer.body


def _struck_out(strikes: int) -> tuple[int, dict[str, Any]]:
    error = HttpError(500, f"the engine failed {strikes} times while this request ran; it is not sent again",
                      "internal_error", None, "internal")
    return error.status, error.body()
