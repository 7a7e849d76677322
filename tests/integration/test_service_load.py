"""Load on loopback with the real model: 32 concurrent streams, a full queue, mass cancellation.

On the shared `default_server` (16 running and 16 waiting at most): these tests abort many
running requests at once, which is what exposes the engine-bug regression test at the end; each
waits until the server is idle again.
"""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import jsonschema
import pytest

from live_server import MAX_NUM_SEQS, MAX_QUEUE_LEN, PERSON_SCHEMA, chat, error_of
from service._gen.formwork.v1 import generation_pb2 as pb

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(default_server):
    return default_server


def test_32_concurrent_streams_complete_with_schema_valid_outputs(server):
    def run(i: int) -> tuple[str, int]:
        request = chat(f"Invent person number {i}. Answer in JSON.", max_tokens=48, temperature=0.8, seed=i,
                       constraint={"json_schema": PERSON_SCHEMA})
        messages = list(server.stub.GenerateStream(request, timeout=180))
        return "".join(m.text for m in messages), messages[-1].finish_reason

    started = time.monotonic()
    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(run, range(32)))
    elapsed = time.monotonic() - started
    for text, finish_reason in results:
        assert finish_reason == pb.FINISH_REASON_STOP, text
        jsonschema.validate(json.loads(text), PERSON_SCHEMA)
    print(f"32 schema-constrained streams in {elapsed:.1f} s")
    load = server.wait_idle()
    assert load.num_free_kv_blocks == load.num_total_kv_blocks


def test_full_queue_is_resource_exhausted_and_cancelling_frees_queued_and_running(server):
    calls = [server.stub.GenerateStream(chat(f"Tell me a long story number {i}.", max_tokens=100), timeout=120)
             for i in range(MAX_NUM_SEQS + MAX_QUEUE_LEN)]
    deadline = time.monotonic() + 30
    while (load := server.model_info().load).num_running + load.num_waiting < len(calls) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert load.num_in_flight == len(calls), load
    assert load.num_running == MAX_NUM_SEQS and load.num_waiting == MAX_QUEUE_LEN, load

    error = error_of(server.stub.Generate, chat("one more", max_tokens=4), timeout=10)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "queue is full: 32 requests in flight (16 running + 16 waiting at most)" in error.details()

    for call in calls:
        call.cancel()
    load = server.wait_idle()
    assert (load.num_running, load.num_waiting, load.num_in_flight) == (0, 0, 0), load
    assert load.num_free_kv_blocks == load.num_total_kv_blocks, load


def test_requests_with_a_compiled_grammar_queued_for_a_slot_count_as_waiting(server):
    # longer than max_tokens, not closed early: every request runs to the cap
    constraint = {"regex": "[a-z ]{400}", "close_early": False}
    server.stub.Generate(chat("warm the grammar cache", max_tokens=2, constraint=constraint), timeout=60)
    calls = [server.stub.GenerateStream(chat(f"Write letters {i}.", max_tokens=100, constraint=constraint),
                                        timeout=120) for i in range(MAX_NUM_SEQS + MAX_QUEUE_LEN)]
    try:
        deadline = time.monotonic() + 30
        while (load := server.model_info().load).num_running < MAX_NUM_SEQS or load.num_waiting < MAX_QUEUE_LEN:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert (load.num_running, load.num_waiting, load.num_waiting_for_grammar) == (MAX_NUM_SEQS, MAX_QUEUE_LEN, 0)
    finally:
        for call in calls:
            call.cancel()
    assert server.wait_idle().num_in_flight == 0


def test_aborts_then_a_grammar_wait_keep_the_engine_alive(server):
    """Regression: finished requests must leave the runner even when a step only waits for a grammar."""
    calls = [server.stub.GenerateStream(chat(f"Tell me a story {i}.", max_tokens=100), timeout=60)
             for i in range(MAX_NUM_SEQS)]
    deadline = time.monotonic() + 30
    while server.model_info().load.num_running < MAX_NUM_SEQS and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.model_info().load.num_running == MAX_NUM_SEQS
    for call in calls:
        call.cancel()
    load = server.wait_idle()  # the engine is idle: no step has told the runner about the aborts yet
    assert load.num_in_flight == load.num_running == 0 and load.num_free_kv_blocks == load.num_total_kv_blocks, load
    fresh = {"type": "object", "properties": {f"field_{time.monotonic_ns()}": {"type": "integer"}}}
    response = server.stub.Generate(chat("x", max_tokens=8, constraint={"json_schema": fresh}), timeout=60)
    assert response.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH)
