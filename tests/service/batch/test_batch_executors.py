"""The executors against in-process front ends over a fake engine core: a gRPC server and an HTTP
server answer a body as the Answerer does (ids and timings aside), and an unreachable server is
"not now" (ExecutorUnavailable), never an answer."""
from __future__ import annotations

import asyncio
import socket

import pytest

from service.batch.executor import ExecutorUnavailable
from service.batch.http_executor import HttpExecutor
from service.batch_cli.grpc_executor import GrpcExecutor
from service.http.answerer import Answerer

BODIES = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64, "n": 2, "seed": 3}),
    ("/v1/completions", {"prompt": ["a", "b"], "max_tokens": 64, "logprobs": 1}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64,
                              "response_format": {"type": "json_object"}}),
    ("/v1/responses", {"input": "hi", "instructions": "Be brief."}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": -1}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "model": "other"}),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1 << 20}),
]
_VARYING = frozenset(("id", "created", "created_at", "timings", "call_id"))


def comparable(value):
    """`value` without what differs between two answers to the same body (ids, times)."""
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items() if k not in _VARYING}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


@pytest.mark.parametrize("kind", ["grpc", "http"])
def test_a_server_answers_a_body_as_the_answerer_does(make_http_server, kind):
    server = make_http_server()
    answerer = Answerer(server.server.llm, 4 << 20)

    async def answers():
        if kind == "grpc":
            executor = await GrpcExecutor.connect(f"127.0.0.1:{server.grpc_port}", max_message_bytes=4 << 20)
        else:
            executor = HttpExecutor(server.url + "/v1", concurrency=2)
        try:
            return [await executor.execute(url, body) for url, body in BODIES]
        finally:
            await executor.aclose()

    got = asyncio.run(answers())
    for (url, body), (status, answer) in zip(BODIES, got):
        expected_status, expected = server.run(answerer.answer(url, body))
        assert (status, comparable(answer)) == (expected_status, comparable(expected)), (url, body)


def test_an_unreachable_server_is_unavailable_not_an_answer():
    with socket.socket() as probe:  # a port nothing listens on once the probe is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def grpc_refused():
        await GrpcExecutor.connect(f"127.0.0.1:{port}", max_message_bytes=1 << 20, timeout_s=0.5)

    with pytest.raises(ExecutorUnavailable, match=f"127.0.0.1:{port}"):
        asyncio.run(grpc_refused())

    async def http_refused():
        executor = HttpExecutor(f"http://127.0.0.1:{port}", concurrency=1)
        try:
            await executor.execute("/v1/completions", {"prompt": "x"})
        finally:
            await executor.aclose()

    with pytest.raises(ExecutorUnavailable, match=f"http://127.0.0.1:{port}"):
        asyncio.run(http_refused())
    with pytest.raises(ValueError, match="must be http://host:port"):
        HttpExecutor("ftp://somewhere")
