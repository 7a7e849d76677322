"""What runs a job's requests: an Executor answers one OpenAI request body, as the API would.

The runner knows nothing else about where the answer comes from: the engine in this process
(service/batch_cli/inprocess.py), a Formwork gRPC server (grpc_executor.py) or any
OpenAI-compatible HTTP server (http_executor.py).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

# statuses that say "not now" rather than "not this request": the runner retries them, and
# never writes them as a request's answer
RETRYABLE_STATUSES = frozenset((429, 502, 503, 504))


class ExecutorUnavailable(Exception):
    """The executor cannot answer at the moment (server unreachable, engine restarting)."""


class Executor(ABC):
    """Answers request bodies; many calls run at once (up to the runner's concurrency)."""

    # requests worth running at once to keep this executor busy (the runner's default concurrency)
    preferred_concurrency: int = 64

    @abstractmethod
    async def execute(self, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """The status and JSON body the API answers a POST of `body` to `url` with (an error
        status and `{"error": ...}` for a body it refuses). Raises ExecutorUnavailable when it
        cannot answer now; cancelling the call abandons the request."""

    async def aclose(self) -> None:
        """Release what the executor holds (connections, the engine)."""
