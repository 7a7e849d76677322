"""The server's lifecycle with the real model: engine-process death, self-healing, quarantine and
SIGTERM (a server per test, but the two self-healing tests share one that restarts its engine)."""
from __future__ import annotations

import json
import os
import signal
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from live_server import PERSON_SCHEMA, LiveServer, chat, error_of
from service._gen.formwork.v1 import generation_pb2 as pb

pytestmark = pytest.mark.slow


SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


def health_status(server: LiveServer) -> int:
    stub = health_pb2_grpc.HealthStub(server.channel)
    return stub.Check(health_pb2.HealthCheckRequest(service="formwork.v1.Generation"), timeout=5).status


def wait_health(server: LiveServer, status: int, timeout_s: float = 600.0) -> int:
    """Poll health until `status` (a restart loads the model again: minutes on a loaded machine)."""
    deadline = time.monotonic() + timeout_s
    while (current := health_status(server)) != status and time.monotonic() < deadline:
        time.sleep(0.02)
    return current


def kill_engine_under(server: LiveServer, request: pb.GenerateRequest) -> tuple[int, float, float]:
    """SIGKILL the engine process while `request` streams; (the killed pid, when it was killed,
    seconds until the stream ended with UNAVAILABLE)."""
    stream = server.stub.GenerateStream(request, timeout=120)
    next(stream)  # it runs in the engine now
    pid = server.engine_pid
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        list(stream)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value
    assert "killed by signal 9" in info.value.details()
    return pid, killed, time.monotonic() - killed


def refusing_calls(server) -> bool:
    """Whether the server refuses new calls yet (a Tokenize call is cheap and runs nothing)."""
    try:
        server.stub.Tokenize(pb.TokenizeRequest(prompt="x"), timeout=5)
        return False
    except grpc.RpcError:
        return True


def test_engine_process_death_turns_into_unavailable_and_not_serving():
    server = LiveServer("--engine-restarts", "0")
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
    server = LiveServer("--shutdown-grace", "3", "--max-tokens-cap", "1500")
    short = server.stub.GenerateStream(chat("Say hello.", max_tokens=8, ignore_eos=True), timeout=60)
    # far longer than the 3 s grace at any speed here (250 tokens took 2.4 s once decoding got faster)
    long = server.stub.GenerateStream(chat("Write a long story.", max_tokens=1500, ignore_eos=True), timeout=60)
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
    assert 1 < long_messages[-1].usage.completion_tokens < 1500
    assert server.process.wait(30) == 0, server.log()
    server.stop()


@pytest.fixture(scope="module")
def healing_server():
    """Restarts its engine after a short backoff; each test counts the restarts it caused."""
    server = LiveServer("--engine-restart-backoff", "0.1")
    yield server
    assert server.stop(timeout_s=30) == 0, server.log()


def test_a_killed_engine_is_restarted_and_serves_again(healing_server):
    server = healing_server
    restarts_before = server.model_info().num_engine_restarts
    old_pid, killed, to_unavailable_s = kill_engine_under(server, chat("Write a long story.", max_tokens=200))
    assert wait_health(server, NOT_SERVING) == NOT_SERVING
    refused = error_of(server.stub.Generate, chat("hi"), timeout=5)
    assert refused.code() == grpc.StatusCode.UNAVAILABLE, refused
    assert wait_health(server, SERVING) == SERVING, server.log()
    to_serving_s = time.monotonic() - killed
    response = server.stub.Generate(chat("Give a person in JSON.", max_tokens=48, temperature=0,
                                         constraint={"json_schema": PERSON_SCHEMA}), timeout=60)
    assert response.finish_reason == pb.FINISH_REASON_STOP and {"name", "age"} <= set(json.loads(response.text))
    info = server.model_info()
    assert info.num_engine_restarts == restarts_before + 1 and "killed by signal 9" in info.last_engine_crash
    assert server.engine_pid != old_pid
    load = server.wait_idle()
    assert load.num_free_kv_blocks == load.num_total_kv_blocks and load.num_in_flight == 0
    print(f"engine kill: UNAVAILABLE after {to_unavailable_s:.2f} s, SERVING again after {to_serving_s:.1f} s")


def test_a_constraint_in_flight_at_two_engine_deaths_is_quarantined(healing_server):
    server = healing_server
    before = server.model_info()
    poison = {"regex": "[a-z ]{50,400}"}
    for attempt in range(2):
        kill_engine_under(server, chat(f"Write letters, try {attempt}.", max_tokens=200, constraint=poison))
        assert wait_health(server, SERVING) == SERVING, server.log()
    refused = error_of(server.stub.Generate, chat("A different prompt.", max_tokens=8, constraint=poison),
                       timeout=10)
    assert refused.code() == grpc.StatusCode.UNAVAILABLE
    assert refused.details().startswith("constraint.regex: quarantined for another "), refused.details()
    other = server.stub.Generate(chat("Say a word.", max_tokens=8, constraint={"regex": "[a-z]{1,20}"}),
                                 timeout=60)
    assert other.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH) and other.text
    info = server.model_info()
    assert info.num_engine_restarts == before.num_engine_restarts + 2
    assert info.num_quarantined_constraints == before.num_quarantined_constraints + 1
    assert "quarantined for 600 s" in server.log()
