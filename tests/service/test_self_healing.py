"""Self-healing against a fake engine core (fast; no model): restarts after a crash, the
quarantine of a constraint in flight at two deaths, giving up, and the engine's memory ceiling."""
from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import grpc
import pytest

from engine.core.core_proc import MemoryPressure
from engine.core.memory_watchdog import MemoryLimit, MemoryWatchdog
from engine.frontend.mp_client import AsyncMPClient
from grammar.constraint import Constraint
from fake_engine_core import CRASH_SEED, fake_config, make_fake_core
from inproc_server import NOT_SERVING, SERVING, InprocServer, long_request
from live_server import error_of, field_violations
from service._gen.formwork.v1 import generation_pb2 as pb
from service.quarantine import Quarantine
from service.supervisor import RestartPolicy

FAST = RestartPolicy(backoff_s=0.01)


@pytest.fixture
def make_server():
    servers, gates = [], []

    def make(**kwargs) -> InprocServer:
        if "restart_gate" in kwargs:
            gates.append(kwargs["restart_gate"])
        servers.append(InprocServer(**kwargs))
        return servers[-1]

    yield make
    for gate in gates:
        gate.set()
    for server in servers:
        server.close()


def wait_health(server: InprocServer, status: int, timeout_s: float = 20.0) -> int:
    deadline = time.monotonic() + timeout_s
    while (current := server.health_status()) != status and time.monotonic() < deadline:
        time.sleep(0.01)
    return current


def model_info(server: InprocServer) -> pb.ModelInfo:
    return server.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5)


# ---- restarts ---------------------------------------------------------------------------------


def test_a_crashed_engine_is_restarted_and_health_returns_to_serving(make_server):
    gate = threading.Event()  # holds the restart, so the time in between can be looked at
    server = make_server(restart_policy=FAST, restart_gate=gate)
    in_flight = server.stub.GenerateStream(long_request(), timeout=30)
    next(in_flight)
    error = error_of(server.stub.Generate, long_request(seed=CRASH_SEED), timeout=10)
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "fake engine crash" in error.details()
    with pytest.raises(grpc.RpcError) as info:
        list(in_flight)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert wait_health(server, NOT_SERVING) == NOT_SERVING
    refused = error_of(server.stub.Generate, pb.GenerateRequest(prompt="meanwhile"), timeout=5)
    assert refused.code() == grpc.StatusCode.UNAVAILABLE and "restarting" in refused.details()
    gate.set()
    assert wait_health(server, SERVING) == SERVING
    info = model_info(server)
    assert info.num_engine_restarts == 1 and "fake engine crash" in info.last_engine_crash
    assert server.stub.Generate(pb.GenerateRequest(prompt="hi", max_tokens=3), timeout=5).usage.completion_tokens == 3
    assert server.num_cores_built == 2


def test_a_constraint_in_flight_at_two_deaths_is_quarantined(make_server):
    server = make_server(restart_policy=FAST)
    poison = long_request(seed=CRASH_SEED, constraint={"regex": "poison+"})
    for _ in range(2):
        assert error_of(server.stub.Generate, poison, timeout=10).code() == grpc.StatusCode.UNAVAILABLE
        assert wait_health(server, SERVING) == SERVING
    refused = error_of(server.stub.Generate, poison, timeout=5)
    assert refused.code() == grpc.StatusCode.UNAVAILABLE
    assert refused.details().startswith("constraint.regex: quarantined for another ")
    validate = error_of(server.stub.ValidateConstraint,
                        pb.ValidateConstraintRequest(constraint=pb.Constraint(regex="poison+")), timeout=5)
    assert validate.code() == grpc.StatusCode.UNAVAILABLE and "quarantined" in validate.details()
    assert server.num_cores_built == 3  # the third try never reached an engine
    other = server.stub.Generate(long_request(max_tokens=3, constraint={"regex": "fine+"}), timeout=5)
    assert other.usage.completion_tokens == 3
    info = model_info(server)
    assert info.num_engine_restarts == 2 and info.num_quarantined_constraints == 1


def test_the_supervisor_gives_up_after_the_restart_limit(make_server):
    server = make_server(restart_policy=RestartPolicy(max_restarts=1, backoff_s=0.01, quarantine_s=0))
    crash = long_request(seed=CRASH_SEED)
    assert error_of(server.stub.Generate, crash, timeout=10).code() == grpc.StatusCode.UNAVAILABLE
    assert wait_health(server, SERVING) == SERVING
    assert error_of(server.stub.Generate, crash, timeout=10).code() == grpc.StatusCode.UNAVAILABLE
    supervisor = server.server.supervisor
    deadline = time.monotonic() + 10
    while not supervisor.gave_up and time.monotonic() < deadline:
        time.sleep(0.01)
    assert supervisor.gave_up and server.health_status() == NOT_SERVING
    error = error_of(server.stub.Generate, pb.GenerateRequest(prompt="x"), timeout=5)
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "not restarted" in error.details()
    assert server.num_cores_built == 2 and supervisor.num_restarts == 1


def test_process_client_restarts_a_killed_core():
    async def main():
        client = AsyncMPClient(fake_config(), core_factory=make_fake_core)
        first = await client.start()
        os.kill(first.pid, signal.SIGKILL)
        error = await client.wait_dead()
        assert "killed by signal 9 (SIGKILL" in str(error)
        assert "SIGKILL" in await client.reap()
        second = await client.restart()
        assert second.pid != first.pid and client.is_alive
        assert (await client.get_stats()).num_total_blocks == 64
        await client.shutdown()

    asyncio.run(main())


# ---- the quarantine ---------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_quarantine_needs_two_strikes_and_expires():
    clock = Clock()
    quarantine = Quarantine(60.0, clock=clock)
    schema = Constraint("json_schema", '{"type": "object"}')
    same_schema = Constraint("json_schema", '{"type":"object"}')  # the same cache key
    assert quarantine.record_strike([schema, same_schema]) == []  # one strike per incident
    assert quarantine.remaining_s(schema) is None
    clock.now += 30
    assert quarantine.record_strike([same_schema]) == [same_schema]
    assert quarantine.remaining_s(schema) == 60.0 and quarantine.num_quarantined == 1
    assert quarantine.remaining_s(Constraint("regex", "a+")) is None
    clock.now += 61
    assert quarantine.remaining_s(schema) is None and quarantine.num_quarantined == 0


def test_strikes_further_apart_than_the_quarantine_time_do_not_add_up():
    clock = Clock()
    quarantine = Quarantine(60.0, clock=clock)
    regex = Constraint("regex", "a{99}")
    quarantine.record_strike([regex])
    clock.now += 61
    assert quarantine.record_strike([regex]) == [] and quarantine.remaining_s(regex) is None


def test_quarantine_time_zero_turns_it_off():
    quarantine = Quarantine(0.0)
    regex = Constraint("regex", "a+")
    for _ in range(3):
        assert quarantine.record_strike([regex]) == []
    assert quarantine.remaining_s(regex) is None


def test_restart_backoff_doubles_up_to_its_cap():
    policy = RestartPolicy(backoff_s=0.5, max_backoff_s=3.0)
    assert [policy.backoff(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    with pytest.raises(ValueError, match="restart limit"):
        RestartPolicy(max_restarts=-1)


# ---- the memory ceiling -----------------------------------------------------------------------


def test_memory_watchdog_reports_each_soft_crossing_once_then_the_hard_limit():
    samples = iter([100, 950, 960, 800, 1001])
    events = []
    watchdog = MemoryWatchdog(MemoryLimit(hard_bytes=1000, soft_fraction=0.9),
                              on_pressure=lambda over, rss: events.append(("soft", over, rss)),
                              on_hard_limit=lambda rss: events.append(("hard", rss)), read_rss=lambda: next(samples))
    assert [watchdog.check() for _ in range(5)] == [True, True, True, True, False]
    assert events == [("soft", True, 950), ("soft", False, 800), ("hard", 1001)]
    assert watchdog.peak_rss_bytes == 1001


def test_an_engine_over_its_soft_memory_limit_refuses_new_requests_and_fails_compiling_ones(make_server):
    server = make_server(restart_policy=FAST)
    blocker = server.stub.GenerateStream(long_request(), timeout=30)  # keeps the engine busy, so it does not exit
    next(blocker)
    engine_inputs = server.server.llm.client._proc.input_queue
    for attempt in range(2):
        compiling = server.stub.GenerateStream(long_request(constraint={"regex": "slow bomb"}), timeout=30)
        server.wait_for(lambda load: load.num_waiting_for_grammar == 1)
        engine_inputs.put(MemoryPressure(True, "RSS 9.00 GiB over the soft limit 8.00 GiB"))
        with pytest.raises(grpc.RpcError) as info:
            list(compiling)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "ran short of memory (RSS 9.00 GiB over the soft limit 8.00 GiB)" in field_violations(info.value)[
            "constraint.regex"]
        refused = error_of(server.stub.Generate, pb.GenerateRequest(prompt="new"), timeout=5)
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "short of memory" in refused.details()
        engine_inputs.put(MemoryPressure(False, "RSS 7.00 GiB under the soft limit 8.00 GiB"))
        assert server.stub.Generate(pb.GenerateRequest(prompt="ok", max_tokens=2), timeout=5).usage.completion_tokens
    # two memory incidents while it compiled: quarantined like a constraint in flight at two deaths
    error = error_of(server.stub.Generate, long_request(constraint={"regex": "slow bomb"}), timeout=5)
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "quarantined" in error.details()
    blocker.cancel()


@pytest.mark.parametrize("limit, reason", [
    (MemoryLimit(hard_bytes=1 << 20), "went over its memory ceiling: RSS"),  # past the hard limit at once
    (MemoryLimit(hard_bytes=1 << 40, soft_fraction=1e-9), "over the soft limit 0.00 GiB with no request left"),
])
def test_the_engine_process_exits_over_its_memory_ceiling(limit, reason):
    async def main():
        client = AsyncMPClient(fake_config(), core_factory=make_fake_core, memory_limit=limit)
        await client.start()
        error = await asyncio.wait_for(client.wait_dead(), 30)
        assert reason in str(error)
        assert await client.reap() == "exited with code 3 (over its memory ceiling)"
        await client.shutdown()

    asyncio.run(main())
