"""The Answerer (one OpenAI body answered whole) against a fake engine core: the same answers and
the same errors as the HTTP routes, a priority that replaces the body's, and `stream: true` refused."""
from __future__ import annotations

import httpx
import pydantic
import pytest

from fake_engine_core import PLAIN_ANSWER
from service.http.answerer import Answerer, Refused, parsed_body

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}


def _answerer(server) -> Answerer:
    return Answerer(server.server.llm, 1 << 20)


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {**CHAT, "temperature": -1}),
    ("/v1/chat/completions", {"messages": "not a list"}),
    ("/v1/chat/completions", {**CHAT, "model": "other"}),
    ("/v1/completions", {"prompt": "x", "n": 99}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 0}),
    ("/v1/embeddings", {"input": "hi"}),
])
def test_errors_are_the_http_servers(make_http_server, path, body):
    server = make_http_server()
    over_http = httpx.post(f"{server.url}{path}", json=body)
    status, answer = server.run(_answerer(server).answer(path, body))
    assert (status, answer) == (over_http.status_code, over_http.json())
    assert status >= 400 and answer["error"]["message"]


def test_answers_have_the_http_servers_shape(make_http_server):
    server = make_http_server()
    answerer = _answerer(server)
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", {"prompt": "x", "max_tokens": 64}),
                       ("/v1/responses", {"input": "hi"})):
        over_http = httpx.post(f"{server.url}{path}", json=body).json()
        status, answer = server.run(answerer.answer(path, body))
        assert status == 200
        assert answer.keys() == over_http.keys()
        assert answer["object"] == over_http["object"]
    status, answer = server.run(answerer.answer("/v1/chat/completions", b'{"messages": [{"role": "user", '
                                                                        b'"content": "hi"}], "max_tokens": 64}'))
    assert status == 200 and answer["choices"][0]["message"]["content"] == PLAIN_ANSWER


def test_stream_is_refused_and_priority_replaces_the_bodys(make_http_server, monkeypatch):
    server = make_http_server()
    llm = server.server.llm
    priorities = []
    generate = llm.generate

    def recording_generate(*args, **kwargs):
        priorities.append(kwargs["priority"])
        return generate(*args, **kwargs)
    monkeypatch.setattr(llm, "generate", recording_generate)
    answerer = _answerer(server)
    status, answer = server.run(answerer.answer("/v1/chat/completions", {**CHAT, "stream": True}))
    assert status == 400 and answer["error"]["param"] == "stream"
    body = {**CHAT, "formwork": {"priority": 3}}
    assert answerer.read("/v1/chat/completions", body).translated.request.priority == 3
    assert answerer.read("/v1/chat/completions", body, priority=10).translated.request.priority == 10
    status, _ = server.run(answerer.answer("/v1/chat/completions", body, priority=10))
    assert status == 200
    assert priorities == [10]


def test_a_body_over_the_size_limit_is_too_large(make_http_server):
    server = make_http_server()
    status, answer = server.run(Answerer(server.server.llm, 100).answer("/v1/completions", {"prompt": "x" * 200}))
    assert status == 413 and "max_message_bytes is 100" in answer["error"]["message"]


class _Body(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    count: int


@pytest.mark.parametrize(("raw", "unsupported_by", "message", "param"), [
    (b"{", None, "the request body is not valid JSON: ", None),
    (b'{"count": "x"}', None, "count: ", "count"),
    (b'{"count": 1, "extra": 2}', None, "extra: Extra inputs are not permitted", "extra"),
    (b'{"count": 1, "extra": 2}', "this API", "extra: not supported by this API", "extra"),
])
def test_parsed_body_refuses_naming_the_first_bad_field(raw, unsupported_by, message, param):
    with pytest.raises(Refused) as refused:
        parsed_body(_Body, raw, unsupported_by)
    assert refused.value.error.message.startswith(message) and refused.value.error.param == param
    assert refused.value.error.status == 400


def test_parsed_body_returns_the_model():
    assert parsed_body(_Body, b'{"count": 3}') == _Body(count=3)
