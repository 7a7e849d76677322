"""The Files and Batches APIs on the HTTP server: their store, their routes and the batch worker,
started and stopped with the server."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from service.batch.store import BatchStore
from service.batch.worker import BatchWorker
from service.http.batch_executor import AnswererExecutor
from service.http.batches import BatchRoutes
from service.http.files import FileRoutes

if TYPE_CHECKING:
    from fastapi import FastAPI, Request

    from service.batch.api_config import BatchApiConfig
    from service.http.answerer import Answerer


class BatchApi:
    """Opens the store under `config.data_dir` (ValueError if another server holds it)."""

    def __init__(self, answerer: Answerer, config: BatchApiConfig, authorize: Callable[[Request], object],
                 is_ready: Callable[[], bool]) -> None:
        self.store = BatchStore(config.data_dir)
        self.worker = BatchWorker(self.store, AnswererExecutor(answerer, config.priority, is_ready), config, is_ready)
        self._files = FileRoutes(self.store, config, authorize)
        self._batches = BatchRoutes(self.store, self.worker, authorize)

    def register(self, app: FastAPI) -> None:
        self._files.register(app)
        self._batches.register(app)

    def start(self) -> None:
        """Resume the unfinished batches (from the running event loop)."""
        self.worker.start()

    async def stop(self) -> None:
        """Stop the worker (its lines in flight are aborted, and resumed on the next start)."""
        await self.worker.stop()

    def close(self) -> None:
        """Close the store (after the routes stopped)."""
        self.store.close()
