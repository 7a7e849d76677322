"""A GenerationServer on its own event-loop thread in this process, in front of a FakeEngineCore
(through an InprocClient), for the fast service tests, with or without its HttpServer; and their
request helpers."""
from __future__ import annotations

import asyncio
import threading
import time

import grpc
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engine.frontend.inproc_client import InprocClient
from fake_engine_core import FakeEngineCore, fake_config
from service._gen.formwork.v1 import generation_pb2 as pb
from service.batch.api_config import BatchApiConfig
from service._gen.formwork.v1 import generation_pb2_grpc as pb_grpc
from service.grpc.server import GenerationServer
from service.http.server import HttpServer
from service.lifecycle import http_server
from service.limits import ServiceLimits
from service.security import SecurityConfig
from service.supervisor import RestartPolicy
from service.observability.telemetry import Telemetry

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


class InprocServer:
    """A GenerationServer on its own event-loop thread, in front of a FakeEngineCore.

    A restart builds a new FakeEngineCore, once `restart_gate` (an Event) is set if one is given."""

    def __init__(self, limits: ServiceLimits = ServiceLimits(), wait_ready: bool = True,
                 restart_policy: RestartPolicy = RestartPolicy(), restart_gate: threading.Event | None = None,
                 **core_kwargs) -> None:
        self.core: FakeEngineCore | None = None
        self.num_cores_built = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        config = core_kwargs.pop("config", fake_config())

        def build_core() -> FakeEngineCore:
            if self.num_cores_built and restart_gate is not None:
                restart_gate.wait(30)
            self.core = FakeEngineCore(config, **core_kwargs)
            self.num_cores_built += 1
            return self.core

        async def make() -> GenerationServer:
            return GenerationServer(InprocClient(build_core), limits, "127.0.0.1", 0, restart_policy=restart_policy)

        self.server = self.run(make())
        self.port = self.run(self.server.start())
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = pb_grpc.GenerationStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        if wait_ready:
            self.run(self.server.wait_started())

    def run(self, coroutine, timeout_s: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def health_status(self) -> int:
        return self.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status

    def load(self) -> pb.Load:
        return self.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5).load

    def wait_for(self, predicate, timeout_s: float = 20.0) -> pb.Load:
        deadline = time.monotonic() + timeout_s
        while not predicate(load := self.load()) and time.monotonic() < deadline:
            time.sleep(0.01)
        return load

    def close(self) -> None:
        self.channel.close()
        try:
            self.run(self.server.stop(0))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)


def long_request(**fields) -> pb.GenerateRequest:
    return json_format.ParseDict({"prompt": "tell me a story", "max_tokens": 500, "ignore_eos": True, **fields},
                                 pb.GenerateRequest())


def idle(load: pb.Load) -> bool:
    return (load.num_running == load.num_waiting == load.num_waiting_for_grammar == load.num_in_flight == 0
            and load.num_free_kv_blocks == load.num_total_kv_blocks)


class InprocHttp:
    """A GenerationServer and its HttpServer on one event-loop thread, before a FakeEngineCore."""

    def __init__(self, security: SecurityConfig = SecurityConfig(), wait_ready: bool = True,
                 telemetry: Telemetry | None = None, batch_config: BatchApiConfig | None = None,
                 **core_kwargs) -> None:
        self.core: FakeEngineCore | None = None
        self.num_cores_built = 0  # 1 + the engine's restarts
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        def build_core() -> FakeEngineCore:
            self.core = FakeEngineCore(fake_config(), **core_kwargs)
            self.num_cores_built += 1
            return self.core

        async def make() -> tuple[GenerationServer, HttpServer]:
            grpc_server = GenerationServer(InprocClient(build_core), ServiceLimits(), "127.0.0.1", 0,
                                           security=security, telemetry=telemetry)
            return grpc_server, http_server(grpc_server, 0, batch_config)

        self.server, self.http = self.run(make())
        self.grpc_port = self.run(self.server.start())
        self.url = f"http://127.0.0.1:{self.run(self.http.start())}"
        if wait_ready:
            self.run(self.server.wait_started())

    def run(self, coroutine, timeout_s: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def wait_idle(self, timeout_s: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.server.llm.num_in_flight == 0 and self.core is not None and not self.core.requests:
                return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        """Stop both servers (again: nothing)."""
        if not self.thread.is_alive():
            return
        try:
            self.run(self.http.stop())
            self.run(self.server.stop(0))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
