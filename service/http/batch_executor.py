"""The batch worker's Executor on the HTTP server: each line answered by the routes' own Answerer,
at the batch priority, so a line gets exactly what a POST of its body would."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from service.batch.executor import Executor

if TYPE_CHECKING:
    from service.http.answerer import Answerer


class AnswererExecutor(Executor):
    def __init__(self, answerer: Answerer, priority: int) -> None:
        self._answerer = answerer
        self._priority = priority  # replaces a line's own formwork.priority

    async def execute(self, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        answer = await self._answerer.answer(url, body, priority=self._priority)
        return answer.status_code, answer.body
