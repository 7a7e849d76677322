"""The gRPC server: the Generation servicer (service/grpc/servicer.py), health, reflection, and the
server's states (service/lifecycle.py runs them in a process):

    start()    bind the port, health NOT_SERVING, load the engine and warm it up in the background
    ready      health SERVING
    engine death   health NOT_SERVING; in-flight and new calls get UNAVAILABLE; the supervisor
               (service/supervisor.py) restarts the engine, and health is SERVING again once warm
    drain()    (SIGTERM / SIGINT in lifecycle.serve(), for the drain delay) health NOT_SERVING for good, calls
               still taken: a load balancer's health check sees it and stops sending new ones
    stop()     health NOT_SERVING, refuse new calls, let in-flight requests finish for the grace
               period, end the rest as FINISH_REASON_CANCELLED
"""
from __future__ import annotations

import asyncio
import logging
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from engine.frontend.core_client import EngineCoreClient
from service.async_llm import AsyncLLM
from service.grpc.access import AccessInterceptor
from service.grpc.reflection import add_reflection
from service.grpc.servicer import GENERATION_SERVICE, GenerationServicer, add_generation_servicer
from service.limits import ServiceLimits
from service.observability.telemetry import Telemetry
from service.quarantine import Quarantine
from service.security import KeyLimiter, SecurityConfig
from service.supervisor import EngineSupervisor, RestartPolicy

logger = logging.getLogger(__name__)

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class GenerationServer:
    """One gRPC server in front of one engine core client."""

    def __init__(self, client: EngineCoreClient, limits: ServiceLimits, host: str = "127.0.0.1",
                 port: int = 50051, warm_up: bool = True, security: SecurityConfig = SecurityConfig(),
                 restart_policy: RestartPolicy = RestartPolicy(), telemetry: Telemetry | None = None) -> None:
        quarantine = Quarantine(restart_policy.quarantine_s)
        self.llm = AsyncLLM(client, limits, quarantine, telemetry)
        self.telemetry = self.llm.telemetry
        self.supervisor = EngineSupervisor(self.llm, restart_policy, quarantine, self._set_serving)
        self.limits = limits
        self.host = host
        self.port = port  # the bound port once started (useful with port 0)
        self.security = security
        # calls in flight per key, over gRPC and HTTP together
        self.key_limiter = KeyLimiter(security.max_concurrent_per_key)
        self._warm_up = warm_up
        self.health = health.aio.HealthServicer()
        interceptors = []
        if security.api_keys:
            interceptors.append(AccessInterceptor(security, self.key_limiter))
        if self.telemetry.tracing is not None:  # inside the access checks: a refused call has no span
            interceptors.append(self.telemetry.tracing.grpc_interceptor(GENERATION_SERVICE))
        self.server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", limits.max_message_bytes),
            ("grpc.max_send_message_length", limits.max_message_bytes),
            ("grpc.so_reuseport", 0),  # a port in use is an error, not a shared port
        ], interceptors=interceptors or None)
        add_generation_servicer(GenerationServicer(self.llm, limits, self.supervisor), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        add_reflection(self.server, (GENERATION_SERVICE, health.SERVICE_NAME))
        self.ready = asyncio.Event()
        self._serving = False
        self._draining = False
        self._startup: asyncio.Task[None] | None = None
        self._supervision: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Bind and serve (health NOT_SERVING) and start loading the engine; returns the port."""
        await self._set_health(_NOT_SERVING)
        warning = self.security.exposure_warning(self.host)
        if warning:
            logger.warning("%s", warning)
        address, tls = f"{self.host}:{self.port}", self.security.tls
        if tls is None:
            self.port = self.server.add_insecure_port(address)
        else:
            credentials = grpc.ssl_server_credentials(
                [(tls.private_key, tls.certificate_chain)], root_certificates=tls.client_ca,
                require_client_auth=tls.client_ca is not None)
            self.port = self.server.add_secure_port(address, credentials)
        await self.server.start()
        self._startup = asyncio.create_task(self._load())
        return self.port

    async def wait_started(self) -> None:
        """Return once the engine is loaded and warm; raise if it failed to start."""
        assert self._startup is not None
        await self._startup

    async def _load(self) -> None:
        started = time.monotonic()
        info = await self.llm.start()
        if self._warm_up:
            await self.llm.warm_up()
        if not self._draining:
            await self._set_health(_SERVING)
        self.ready.set()
        self._supervision = asyncio.create_task(self.supervisor.run())
        logger.info("%s loaded and warm in %.1f s", info.model_name, time.monotonic() - started)

    async def drain(self) -> None:
        """Report NOT_SERVING from now on (an engine restart does not bring SERVING back); calls
        are still served until stop()."""
        self._draining = True
        await self._set_health(_NOT_SERVING)

    async def _set_serving(self, serving: bool) -> None:
        if not self.llm.closing and not self._draining:
            await self._set_health(_SERVING if serving else _NOT_SERVING)

    @property
    def serving(self) -> bool:
        """What health reports: loaded and warm, the engine up (not restarting), not stopping."""
        return self._serving and self.llm.client.is_alive and not self.llm.closing

    async def _set_health(self, status: int) -> None:
        self._serving = status == _SERVING
        for name in ("", GENERATION_SERVICE):
            await self.health.set(name, status)

    async def stop(self, grace_s: float | None = None) -> None:
        """Graceful stop: refuse new calls, give in-flight requests `grace_s` (default: the limit)
        to finish, end the rest with FINISH_REASON_CANCELLED, then stop the engine."""
        grace_s = self.limits.shutdown_grace_s if grace_s is None else grace_s
        await self.health.enter_graceful_shutdown()
        self.llm.stop_accepting()
        if self._startup is not None and not self._startup.done():
            self._startup.cancel()
        logger.info("stopping: %d requests in flight, %.0f s grace", self.llm.num_in_flight, grace_s)
        # new RPCs are refused from now; grpc cancels handlers still running at the end
        server_stopped = asyncio.create_task(self.server.stop(grace_s + 5.0))
        deadline = time.monotonic() + grace_s
        while self.llm.num_in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.llm.num_in_flight:
            logger.warning("grace period over: cancelling %d requests", self.llm.abort_all())
        await server_stopped
        if self._supervision is not None:
            self._supervision.cancel()
        await self.llm.shutdown()
        self.telemetry.shutdown()
