"""An Executor over the engine in this process: AsyncLLM and its engine core process, started as
`formwork serve` starts them, answering each body through the HTTP API's Answerer, without sockets."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from engine.frontend.core_client import EngineDeadError
from engine.frontend.mp_client import AsyncMPClient
from service.async_llm import AsyncLLM
from service.batch.executor import Executor, ExecutorUnavailable
from service.http.answerer import Answerer

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from service.limits import ServiceLimits


class InProcessExecutor(Executor):
    def __init__(self, llm: AsyncLLM, answerer: Answerer, max_num_seqs: int, priority: int | None = None) -> None:
        self.llm = llm
        self.answerer = answerer
        self.priority = priority
        # twice the batch: the next requests are admitted (and their prompts share the cached
        # prefix) as soon as running ones finish
        self.preferred_concurrency = 2 * max_num_seqs

    @classmethod
    async def start(cls, config: EngineConfig, limits: ServiceLimits, *, log_level: int = logging.WARNING,
                    priority: int | None = None) -> InProcessExecutor:
        """Start the engine (loads the model); ExecutorUnavailable when it cannot start."""
        llm = AsyncLLM(AsyncMPClient(config, log_level=log_level), limits)
        try:
            await llm.start()
        except EngineDeadError as e:
            await llm.shutdown()
            raise ExecutorUnavailable(f"the engine did not start: {e}") from None
        return cls(llm, Answerer(llm, limits.max_message_bytes), config.scheduler.max_num_seqs, priority)

    async def execute(self, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return await self.answerer.answer(url, body, priority=self.priority)

    async def aclose(self) -> None:
        await self.llm.shutdown()
