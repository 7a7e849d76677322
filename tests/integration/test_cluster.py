"""Three real replicas behind a real Envoy on loopback (service/cluster.py, service/envoy_config.py).

Envoy adds the replica that answered to every response (x-formwork-replica), and each replica's
GetModelInfo counts its grammar compiles, so routing is checked from both sides. The tests run in
order on one cluster: the last two take a replica away each (SIGTERM, then SIGKILL).
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from formwork_client import CONSTRAINT_KEY_HEADER, constraint_key, pb, regex
from formwork_client._gen.formwork.v1 import generation_pb2_grpc as pb_grpc
from formwork_client.connection import call_metadata
from formwork_client.errors import from_rpc_error
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from service.cluster import Cluster
from service.envoy_config import REPLICA_HEADER, EnvoySettings

pytestmark = pytest.mark.slow

SERVE_ARGS = ("--max-num-seqs", "4", "--num-blocks", "128", "--max-model-len", "512", "--threads", "1",
              "--max-queue-len", "32", "--drain-delay", "3", "--shutdown-grace", "60")
CALL_TIMEOUT_S = 180.0  # generous: the machine is shared; a call that hangs fails on it


@pytest.fixture(scope="module")
def cluster(model_dir):
    settings = EnvoySettings(health_interval_s=0.5, expose_replica=True)
    with Cluster(3, SERVE_ARGS, settings=settings) as running:
        running.start(timeout_s=900)
        yield running


@pytest.fixture(scope="module")
def stub(cluster):
    with grpc.insecure_channel(cluster.address) as channel:
        yield pb_grpc.GenerationStub(channel)


def generate(stub, request: pb.GenerateRequest) -> tuple[pb.GenerateResponse, str]:
    """The response and the replica (host:port) that Envoy sent the request to."""
    response, call = stub.Generate.with_call(request, timeout=CALL_TIMEOUT_S, metadata=call_metadata(None, request))
    return response, dict(call.initial_metadata())[REPLICA_HEADER]


def replica_load(cluster, index: int) -> pb.Load:
    with grpc.insecure_channel(cluster.replicas[index].address) as channel:
        return pb_grpc.GenerationStub(channel).GetModelInfo(pb.GetModelInfoRequest(), timeout=30).load


def test_health_reflection_and_http_through_envoy(cluster, stub):
    with grpc.insecure_channel(cluster.address) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="formwork.v1.Generation"), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        (listed,) = reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                                    timeout=10)
        assert "formwork.v1.Generation" in {s.name for s in listed.list_services_response.service}
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.http_port}/v1/models", timeout=30) as response:
        assert json.load(response)["data"][0]["id"]
        assert response.headers[REPLICA_HEADER]


def test_requests_without_a_key_spread_across_replicas(cluster, stub):
    request = pb.GenerateRequest(prompt="Say something.", max_tokens=4, temperature=0)
    served, deadline = [], time.monotonic() + 30
    # each of Envoy's clusters health-checks the replicas on its own: the keyless one may still be
    # admitting a replica when the first batch goes out, so send batches until the deadline
    while len({replica for _, replica in served}) < 2 and time.monotonic() < deadline:
        with ThreadPoolExecutor(6) as pool:
            served += pool.map(lambda _: generate(stub, request), range(18))
    replicas = {replica for _, replica in served}
    assert len(replicas) >= 2, replicas
    assert all(response.finish_reason == pb.FINISH_REASON_LENGTH for response, _ in served)


def test_same_constraint_key_lands_on_one_replica_and_compiles_once(cluster, stub):
    # the key's ring must hold all three replicas in every Envoy worker before the calls: a replica
    # admitted in between moves the key (Envoy's admin shows health at once, its workers a moment later)
    cluster.wait_healthy(3, timeout_s=30)
    time.sleep(1.0)
    before = [replica_load(cluster, i) for i in range(3)]
    constraint = regex(f"affinity-{time.time_ns()}-[0-9]{{2}}")  # new to every replica's cache
    request = pb.GenerateRequest(prompt="Write the code:", max_tokens=48, temperature=0, constraint=constraint)
    with ThreadPoolExecutor(3) as pool:
        served = list(pool.map(lambda _: generate(stub, request), range(6)))
    assert len({replica for _, replica in served}) == 1
    after = [replica_load(cluster, i) for i in range(3)]
    compiles = [a.num_grammar_compiles - b.num_grammar_compiles for a, b in zip(after, before)]
    hits = [a.num_grammar_cache_hits - b.num_grammar_cache_hits for a, b in zip(after, before)]
    assert sorted(compiles) == [0, 0, 1], compiles
    assert hits[compiles.index(1)] >= 3  # the others found it compiled (or joined the compile in flight)
    assert all(response.text.startswith("affinity-") for response, _ in served)
    assert constraint_key(constraint) == call_metadata(None, request)[-1][1]
    assert call_metadata(None, request)[-1][0] == CONSTRAINT_KEY_HEADER


def test_sigterm_drains_a_replica_that_finishes_its_in_flight_requests(cluster, stub):
    long = pb.GenerateRequest(prompt="Tell a long story.", max_tokens=120, temperature=0, ignore_eos=True)
    stream = stub.GenerateStream(long, timeout=CALL_TIMEOUT_S)
    first = next(stream)
    drained_address = dict(stream.initial_metadata())[REPLICA_HEADER]
    index = next(i for i, r in enumerate(cluster.replicas) if r.address == drained_address)
    cluster.replicas[index].process.send_signal(signal.SIGTERM)
    others = [r.address for r in cluster.replicas if r.address != drained_address]
    # NOT_SERVING seen by every Envoy cluster, within the drain delay, and the other two still in
    cluster.wait_healthy(2, timeout_s=30, addresses=others)
    time.sleep(1.0)  # Envoy's admin shows a host's health at once; its workers' balancers follow a moment later
    assert cluster.replicas[index].running  # still draining
    keyed = pb.GenerateRequest(prompt="Go:", max_tokens=8, temperature=0, constraint=regex("[a-z]{3}"))
    plain = pb.GenerateRequest(prompt="Go:", max_tokens=4, temperature=0)
    with ThreadPoolExecutor(4) as pool:
        served = list(pool.map(lambda r: generate(stub, r), [keyed, plain] * 4))
    assert drained_address not in {replica for _, replica in served}
    rest = list(stream)
    assert rest[-1].finish_reason == pb.FINISH_REASON_LENGTH
    assert len(first.token_ids) + sum(len(r.token_ids) for r in rest) == 120
    assert cluster.replicas[index].process.wait(120) == 0


def test_sigkill_loses_only_the_in_flight_requests_of_that_replica(cluster, stub):
    alive = [i for i, r in enumerate(cluster.replicas) if r.running]
    assert len(alive) == 2
    victim = cluster.replicas[alive[0]]
    request = pb.GenerateRequest(prompt="Count to fifty:", max_tokens=48, temperature=0, ignore_eos=True)
    # the streams run long, so that they are still under way when the victim dies
    long_request = pb.GenerateRequest(prompt="Count to fifty:", max_tokens=160, temperature=0, ignore_eos=True)
    outcomes: list[tuple[str, str]] = []  # (status, replica or "")
    lock = threading.Lock()
    killed_at = [float("inf")]

    def one(_: int) -> None:
        try:
            _, replica = generate(stub, request)
            outcome = ("OK", replica)
        except grpc.RpcError as e:
            outcome = (e.code().name, "")
        with lock:
            outcomes.append(outcome)

    def streamed(_: int) -> None:
        stream = stub.GenerateStream(long_request, timeout=CALL_TIMEOUT_S)
        try:
            next(stream)  # under way: output has been sent
            replica = dict(stream.initial_metadata())[REPLICA_HEADER]
            list(stream)
            # a stream that ended before the kill was not cut by it
            outcome = ("OK" if time.monotonic() > killed_at[0] else "OK before the kill", replica)
        except grpc.RpcError as e:
            replica = dict(stream.initial_metadata() or ()).get(REPLICA_HEADER, "")
            outcome = (str(from_rpc_error(e)), replica)  # as both clients report it
        with lock:
            stream_outcomes.append(outcome)

    stream_outcomes: list[tuple[str, str]] = []
    with ThreadPoolExecutor(10) as pool:
        futures = [pool.submit(one, i) for i in range(8)] + [pool.submit(streamed, i) for i in range(2)]
        deadline = time.monotonic() + 60
        while replica_load(cluster, alive[0]).num_running == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # streams have sent output
        killed_at[0] = time.monotonic()
        os.killpg(victim.process.pid, signal.SIGKILL)  # the server and its engine process
        for future in futures:
            future.result()
    statuses = [status for status, _ in outcomes]
    # nothing hung into DEADLINE_EXCEEDED; Envoy retries some of the victim's unary calls on the
    # survivor (it reports a reset before any response as UNAVAILABLE), the rest end UNAVAILABLE
    assert set(statuses) <= {"OK", "UNAVAILABLE"}, statuses
    assert "OK" in statuses, statuses
    # a stream cut after its first output cannot be answered with a status any more: Envoy resets
    # it (gRPC alone says INTERNAL "Stream removed (RST_STREAM (Received RST_STREAM with error code
    # 2))"), and the clients report UNAVAILABLE; it ends at once, never hangs
    cut = [status for status, replica in stream_outcomes
           if replica == victim.address and status != "OK before the kill"]
    assert all(status.startswith("UNAVAILABLE") for status in cut), stream_outcomes
    # after the kill, every request succeeds on the survivor
    after = [generate(stub, pb.GenerateRequest(prompt="Hi", max_tokens=2)) for _ in range(4)]
    assert {replica for _, replica in after} == {cluster.replicas[alive[1]].address}
