"""uvicorn serving the OpenAI API inside `formwork serve`'s event loop, beside the gRPC server.

No second engine and no proxy hop: the routes call the AsyncLLM the gRPC server serves from. The
signals belong to serve(), which stops this server with the gRPC one; TLS uses the same
certificate and key as gRPC (and requires client certificates when gRPC does).
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import tempfile
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import uvicorn

from service.http.app import OpenAIApi

if TYPE_CHECKING:
    from service.async_llm import AsyncLLM
    from service.batch.api_config import BatchApiConfig
    from service.limits import ServiceLimits
    from service.observability.tracing import Tracing
    from service.security import KeyLimiter, SecurityConfig, TlsFiles


class _EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # serve() owns SIGTERM / SIGINT
        yield


class HttpServer:
    """The HTTP front end of the server's AsyncLLM; `is_ready` says whether it serves (as gRPC health does).
    With `batch_config`, the Files and Batches APIs too, and their batch worker runs while it serves."""

    def __init__(self, llm: AsyncLLM, limits: ServiceLimits, security: SecurityConfig, limiter: KeyLimiter,
                 is_ready: Callable[[], bool], host: str, port: int, batch_config: BatchApiConfig | None = None
                 ) -> None:
        self.host = host
        self.port = port  # the bound port once started (useful with port 0)
        self.security = security
        self.api = OpenAIApi(llm, limits, security, limiter, is_ready, batch_config)
        self._tracing: Tracing | None = llm.telemetry.tracing
        self._server: _EmbeddedServer | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.security.tls else "http"

    async def start(self) -> int:
        """Bind and serve (/health 503 until the engine is ready); returns the port."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.create_server((self.host.strip("[]"), self.port), family=family, backlog=2048)
        # accepted connections inherit it: without, each SSE event after the headers waits for the
        # client's delayed ACK (~40 ms); asyncio sets it only on sockets it creates itself
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.port = sock.getsockname()[1]
        tracing = self._tracing
        app = self.api.app if tracing is None else tracing.asgi_app(self.api.app)
        config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False,
                                timeout_keep_alive=30, timeout_graceful_shutdown=None)
        config.load()
        if self.security.tls is not None:
            config.ssl = _ssl_context(self.security.tls)
        self._server = _EmbeddedServer(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started and not self._task.done():
            await asyncio.sleep(0.01)
        if self._task.done():
            self._task.result()  # raises what stopped it
        if self.api.batch_api is not None:
            self.api.batch_api.start()
        return self.port

    async def stop(self) -> None:
        """Stop the batch worker (its lines in flight are aborted, and resumed on the next start),
        stop accepting connections and wait for open responses to end (serve() ends the requests)."""
        batch_api = self.api.batch_api
        if batch_api is not None:
            await batch_api.stop()
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
        if batch_api is not None:
            batch_api.close()


def _ssl_context(tls: TlsFiles) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    # load_cert_chain reads files only: the PEMs go through a private directory, removed at once
    with tempfile.TemporaryDirectory(prefix="formwork-tls-") as directory:
        cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
        for path, data in ((cert, tls.certificate_chain), (key, tls.private_key)):
            with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
                f.write(data)
        context.load_cert_chain(cert, key)
    if tls.client_ca is not None:
        context.load_verify_locations(cadata=tls.client_ca.decode())
        context.verify_mode = ssl.CERT_REQUIRED
    return context
