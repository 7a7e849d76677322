"""A server process's life: start gRPC (and HTTP), serve until SIGTERM or SIGINT, drain, stop."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.frontend.core_client import EngineCoreClient
from service.batch.store import DataDirInUse
from service.grpc.server import GenerationServer
from service.limits import ServiceLimits
from service.observability.telemetry import Telemetry
from service.security import SecurityConfig
from service.supervisor import RestartPolicy

if TYPE_CHECKING:
    from service.batch.api_config import BatchApiConfig
    from service.http.server import HttpServer

logger = logging.getLogger(__name__)


async def serve(client: EngineCoreClient, limits: ServiceLimits, host: str, port: int,
                on_ready: Callable[[GenerationServer], None] | None = None,
                security: SecurityConfig = SecurityConfig(), http_port: int | None = None,
                on_http_ready: Callable[[HttpServer], None] | None = None,
                restart_policy: RestartPolicy = RestartPolicy(), telemetry: Telemetry | None = None,
                batch_config: BatchApiConfig | None = None) -> int:
    """Run a server until SIGTERM or SIGINT; returns the process exit code (0 after a graceful
    stop, 1 if the engine failed to start). The signal starts the drain delay (limits.drain_delay_s:
    NOT_SERVING, calls still taken), then the grace period; a second signal cuts both short.
    With `http_port`, the OpenAI-compatible HTTP API (service/http/) is served too, on the same
    AsyncLLM and host, and with `batch_config` its Files and Batches APIs."""
    server = GenerationServer(client, limits, host, port, security=security, restart_policy=restart_policy,
                              telemetry=telemetry)
    try:
        http = http_server(server, http_port, batch_config) if http_port is not None else None
    except DataDirInUse as e:
        assert batch_config is not None and http_port is not None
        if batch_config.required:
            logger.error("cannot serve the Batches API: %s", e)
            return 1
        logger.warning("serving without the Files and Batches APIs: %s", e)
        http = http_server(server, http_port)
    except ValueError as e:  # a data directory that is not Formwork's
        logger.error("cannot serve the Batches API: %s", e)
        return 1
    stop = asyncio.Event()
    hurry = asyncio.Event()  # a second signal: no more waiting

    def on_signal() -> None:
        if stop.is_set():
            hurry.set()
            logger.warning("second signal: cancelling %d in-flight requests now", server.llm.abort_all())
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    await server.start()
    if http is not None:
        try:
            await http.start()
        except OSError as e:  # the port is taken, most often
            logger.error("cannot serve HTTP on %s:%d: %s (--http-port PORT, or --no-http)", host, http_port, e)
            await server.stop(0)
            return 1
    stop_requested = asyncio.create_task(stop.wait())
    started = asyncio.create_task(server.wait_started())
    await asyncio.wait({stop_requested, started}, return_when=asyncio.FIRST_COMPLETED)
    if started.done() and started.exception() is not None:
        logger.error("the engine failed to start: %s", started.exception())
        stop_requested.cancel()
        await _stop_both(server, http, 0)
        return 1
    if started.done() and on_ready is not None:
        on_ready(server)
    if started.done() and http is not None and on_http_ready is not None:
        on_http_ready(http)
    await stop_requested
    await _drain(server, limits.drain_delay_s, hurry)
    await _stop_both(server, http, 0.0 if hurry.is_set() else None)
    return 0


def http_server(server: GenerationServer, port: int, batch_config: BatchApiConfig | None = None) -> HttpServer:
    """The OpenAI-compatible HTTP front end on `server`'s AsyncLLM, host, security and per-key
    limits (calls in flight per key count over both front ends); /health follows gRPC health.
    With `batch_config`, the Files and Batches APIs too."""
    from service.http.server import HttpServer  # the web stack, only when HTTP is served
    return HttpServer(server.llm, server.limits, server.security, server.key_limiter, lambda: server.serving,
                      server.host, port, batch_config)


async def _drain(server: GenerationServer, delay_s: float, hurry: asyncio.Event) -> None:
    """NOT_SERVING for `delay_s` while calls are still served (unless `hurry` is set first)."""
    if delay_s <= 0:
        return
    await server.drain()
    logger.info("draining: NOT_SERVING for %.1f s before refusing new calls (%d in flight)",
                delay_s, server.llm.num_in_flight)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(hurry.wait(), delay_s)


async def _stop_both(server: GenerationServer, http: HttpServer | None, grace_s: float | None = None) -> None:
    """HTTP stops taking connections while gRPC's stop lets in-flight requests (of both) finish."""
    http_stopped = asyncio.create_task(http.stop()) if http is not None else None
    await server.stop(grace_s)
    if http_stopped is not None:
        await http_stopped
