"""The server's lifecycle with the real model: engine-process death and SIGTERM (a server per test)."""
from __future__ import annotations

import os
import signal
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from live_server import LiveServer, chat, error_of
from service._gen.formwork.v1 import generation_pb2 as pb

pytestmark = pytest.mark.slow


def health_status(server: LiveServer) -> int:
    stub = health_pb2_grpc.HealthStub(server.channel)
    return stub.Check(health_pb2.HealthCheckRequest(service="formwork.v1.Generation"), timeout=5).status


def refusing_calls(server) -> bool:
    """Whether the server refuses new calls yet (a Tokenize call is cheap and runs nothing)."""
    try:
        server.stub.Tokenize(pb.TokenizeRequest(prompt="x"), timeout=5)
        return False
    except grpc.RpcError:
        return True


def test_engine_process_death_turns_into_unavailable_and_not_serving():
    server = LiveServer()
    try:
        assert health_status(server) == health_pb2.HealthCheckResponse.SERVING
        stream = server.stub.GenerateStream(chat("Write a long story.", max_tokens=200), timeout=60)
        next(stream)
        os.kill(server.engine_pid, signal.SIGKILL)
        with pytest.raises(grpc.RpcError) as info:
            list(stream)  # a missed death would end at the stream's deadline instead: DEADLINE_EXCEEDED
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "killed by signal 9" in info.value.details()
        for call, message in ((server.stub.Generate, chat("hi")), (server.stub.GetModelInfo, pb.GetModelInfoRequest()),
                              (server.stub.ValidateConstraint, pb.ValidateConstraintRequest(
                                  constraint=pb.Constraint(regex="a")))):
            error = error_of(call, message, timeout=5)
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error
        assert health_status(server) == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        assert server.stop(timeout_s=20) == 0, server.log()


def test_sigterm_finishes_in_flight_requests_within_the_grace_period_then_exits_0():
    server = LiveServer("--shutdown-grace", "3")
    short = server.stub.GenerateStream(chat("Say hello.", max_tokens=8, ignore_eos=True), timeout=60)
    long = server.stub.GenerateStream(chat("Write a long story.", max_tokens=250, ignore_eos=True), timeout=60)
    next(short), next(long)
    server.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 20
    while not refusing_calls(server) and time.monotonic() < deadline:
        time.sleep(0.01)
    refused = error_of(server.stub.Generate, chat("too late"), timeout=5)
    assert refused.code() == grpc.StatusCode.UNAVAILABLE
    short_messages, long_messages = list(short), list(long)
    assert short_messages[-1].finish_reason == pb.FINISH_REASON_LENGTH
    assert short_messages[-1].usage.completion_tokens == 8
    assert long_messages[-1].finish_reason == pb.FINISH_REASON_CANCELLED  # past the grace period
    assert 1 < long_messages[-1].usage.completion_tokens < 250
    assert server.process.wait(30) == 0, server.log()
    server.stop()
