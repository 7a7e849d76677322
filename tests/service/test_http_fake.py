"""The HTTP API's access rules and lifecycle against a fake engine core (fast; no model run):
health while loading and after the engine dies, API keys, the per-key limit shared with gRPC,
and a client that goes away mid-stream. tests/integration/test_http_api.py covers generation on the real model."""
from __future__ import annotations

import asyncio
import json

import grpc
import httpx

from fake_engine_core import CRASH_SEED, PLAIN_ANSWER
from live_server import chat, error_of
from service._gen.formwork.v1 import generation_pb2_grpc as pb_grpc
from service.security import SecurityConfig

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def test_health_follows_the_engine(make_http_server):
    server = make_http_server(wait_ready=False, startup_s=1.0)
    loading = httpx.get(f"{server.url}/health")
    assert loading.status_code == 503
    assert loading.json()["error"]["message"] == "the model is still loading; retry once health reports SERVING"
    refused = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "unavailable"
    server.run(server.server.wait_started())
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    answer = httpx.post(f"{server.url}/v1/chat/completions", json={**CHAT, "max_tokens": 64}).json()
    assert answer["choices"][0]["message"]["content"] == PLAIN_ANSWER
    # the engine dies: health and every call say so
    crashed = httpx.post(f"{server.url}/v1/chat/completions", json={**CHAT, "seed": CRASH_SEED})
    assert crashed.status_code == 503, crashed.text
    assert "the engine is unavailable" in crashed.json()["error"]["message"]
    assert httpx.get(f"{server.url}/health").status_code == 503
    assert httpx.post(f"{server.url}/v1/completions", json={"prompt": "x"}).status_code == 503


def test_api_keys_and_the_shared_per_key_limit(make_http_server):
    server = make_http_server(security=SecurityConfig(api_keys=("key-1", "key-2"), max_concurrent_per_key=1),
                         step_s=0.05)
    assert httpx.get(f"{server.url}/health").status_code == 200  # open, for probes
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "key-1"}):
        refused = httpx.get(f"{server.url}/v1/models", headers=headers)
        assert refused.status_code == 401
        assert refused.json()["error"] == {
            "message": "missing or invalid API key: send the header 'Authorization: Bearer <key>'",
            "type": "authentication_error", "param": None, "code": "invalid_api_key"}
    key_1, key_2 = {"Authorization": "Bearer key-1"}, {"Authorization": "Bearer key-2"}
    assert httpx.get(f"{server.url}/v1/models", headers=key_1).status_code == 200
    stream = {**CHAT, "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=stream, headers=key_1) as held:
        assert held.status_code == 200
        lines = held.iter_lines()  # kept: a dropped iterator closes the stream
        next(lines)
        over = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, headers=key_1)
        assert over.status_code == 429 and over.headers["retry-after"] == "1"
        assert over.json()["error"]["message"] == ("this API key already has 1 requests in flight, the server's "
                                                   "limit per key (--max-concurrent-per-key)")
        # the same limit on gRPC: the key's one call is the HTTP stream
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            stub = pb_grpc.GenerationStub(channel)
            error = error_of(stub.Generate, chat("hi", max_tokens=2), metadata=(("authorization", "Bearer key-1"),),
                             timeout=10)
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, headers=key_2).status_code == 200
    assert server.wait_idle()
    assert httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, headers=key_1).status_code == 200


def test_a_client_that_goes_away_mid_stream_aborts_its_requests(make_http_server):
    server = make_http_server(step_s=0.05)
    body = {**CHAT, "max_tokens": 200, "ignore_eos": True, "stream": True, "n": 2}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body) as response:
        lines = response.iter_lines()
        chunks = [json.loads(line[6:]) for line in (next(lines) for _ in range(8)) if line.startswith("data: ")]
        assert {c["choices"][0]["index"] for c in chunks} == {0, 1}
        assert server.server.llm.num_in_flight == 2
    assert server.wait_idle()
    assert server.core is not None and len(server.core.aborted) == 2


def test_a_grammar_error_before_the_first_token_is_a_400_even_when_streaming(make_http_server):
    server = make_http_server()
    body = {**CHAT, "stream": True, "structured_outputs": {"json": '{"type": "object"'}}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "structured_outputs.json"
    assert response.json()["error"]["message"].startswith("structured_outputs.json: json_schema is not valid JSON")


def test_the_bench_http_client_records_what_the_grpc_one_does(make_http_server):
    from bench.http_client import HttpClient
    from bench.serve import Client, LoadShape, RequestSpec, run_load

    server = make_http_server()
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
    specs = [RequestSpec(f"s{i}", [{"role": "user", "content": f"person {i}"}], 32, schema=schema if i % 2 else None)
             for i in range(2)]

    async def go():
        grpc_client = Client(f"127.0.0.1:{server.grpc_port}", rpc_timeout_s=30)
        http_client = HttpClient(server.url, grpc_client, rpc_timeout_s=30)
        try:
            return (await run_load(grpc_client, specs, LoadShape(concurrency=2, max_requests=4)),
                    await run_load(http_client, specs, LoadShape(concurrency=2, max_requests=4)))
        finally:
            await http_client.close()
            await grpc_client.close()

    over_grpc, over_http = asyncio.run(go())
    assert all(r.ok for r in over_http.records), [r.error for r in over_http.records]
    by_id = {r.request_id: r for r in over_grpc.records}
    for record in over_http.records:
        expected = by_id[record.request_id]
        assert (record.text, record.finish_reason) == (expected.text, expected.finish_reason)
        assert (record.num_prompt_tokens, record.num_output_tokens, record.forward_passes) == (
            expected.num_prompt_tokens, expected.num_output_tokens, expected.forward_passes)
        assert 0 < record.ttft_s <= record.e2e_s and 0 < record.server_ttft_s <= record.server_total_s


def test_connections_send_each_event_at_once(make_http_server):
    """TCP_NODELAY on every accepted connection: without it an SSE event that follows the headers
    waits for the client's delayed ACK (about 40 ms on Linux) before it leaves."""
    import socket

    server = make_http_server()
    with httpx.Client() as client:
        with client.stream("POST", f"{server.url}/v1/chat/completions", json={**CHAT, "stream": True}) as response:
            lines = response.iter_lines()
            next(lines)
            connections = list(server.http._server.server_state.connections)  # uvicorn's open connections
            assert connections
            for connection in connections:
                sock = connection.transport.get_extra_info("socket")
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_a_key_a_nested_object_does_not_read_is_a_400_naming_it(make_http_server):
    server = make_http_server()
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True, "continuous": True}}
    refused = httpx.post(f"{server.url}/v1/chat/completions", json=body)
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == "stream_options.continuous: Extra inputs are not permitted"
    assert refused.json()["error"]["param"] == "stream_options.continuous"
    stored = httpx.post(f"{server.url}/v1/responses", json={"input": "hi", "previous_response_id": "resp_1"})
    assert stored.status_code == 400 and stored.json()["error"]["param"] == "previous_response_id"
