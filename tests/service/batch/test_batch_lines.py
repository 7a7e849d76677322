"""OpenAI batch lines: request lines parsed or refused with an error naming the problem, output
lines in OpenAI's shapes, and each custom_id kept by one line."""
from __future__ import annotations

import json

import pytest

from service.batch.lines import (LineError, RequestLine, answer_line, error_line, output_key, parse_line, read_lines)


def request(custom_id="a", url="/v1/chat/completions", **fields) -> bytes:
    line = {"custom_id": custom_id, "method": "POST", "url": url,
            "body": {"messages": [{"role": "user", "content": "hi"}]}, **fields}
    return json.dumps(line).encode()


def test_a_request_line_is_parsed():
    line = parse_line(request("doc-1", "/v1/responses", body={"input": "hi"}), 3)
    assert line == RequestLine(3, "doc-1", "/v1/responses", {"input": "hi"})
    assert line.key == "doc-1"


@pytest.mark.parametrize(("text", "custom_id", "code", "message"), [
    (b"not json", None, "invalid_json_line", "line 7 is not valid JSON"),
    (b"[1, 2]", None, "invalid_request_line", "line 7 is list, not a JSON object"),
    (b'{"method": "POST"}', None, "missing_custom_id", "line 7 has no custom_id"),
    (request(custom_id=""), None, "missing_custom_id", "line 7 has no custom_id"),
    (request(method="GET"), "a", "invalid_method", "method must be \"POST\", got 'GET'"),
    (request(url="/v1/embeddings"), "a", "invalid_url", "url must be one of /v1/chat/completions"),
    (request(body="hi"), "a", "invalid_request_line", "body must be a JSON object"),
    (request(body={"prompt": "x", "stream": True}), "a", "stream_not_supported", "body.stream must be false"),
    (request(extra=1), "a", "invalid_request_line", "unknown field 'extra'"),
])
def test_a_line_that_cannot_be_sent_is_an_error_naming_the_problem(text, custom_id, code, message):
    line = parse_line(text, 7)
    assert isinstance(line, LineError)
    assert (line.custom_id, line.code) == (custom_id, code)
    assert message in line.message
    assert line.key == (custom_id if custom_id is not None else 7)


def test_a_duplicate_custom_id_is_an_error_for_the_later_line_only():
    lines = read_lines([request("a"), b"", request("b"), request("a", url="/v1/nope"), request("a")])
    assert [line.line_number for line in lines] == [1, 3, 4, 5]  # a blank line keeps its number
    first, second, third, fourth = lines
    assert isinstance(first, RequestLine) and isinstance(second, RequestLine)
    for duplicate in (third, fourth):
        assert isinstance(duplicate, LineError) and duplicate.code == "duplicate_custom_id"
        assert duplicate.custom_id is None and "already used by line 1" in duplicate.message
    assert len({line.key for line in lines}) == 4


def test_output_lines_have_openais_shapes():
    answer = answer_line("a", 200, {"object": "chat.completion"})
    assert answer["id"].startswith("batch_req_") and answer["custom_id"] == "a" and answer["error"] is None
    assert answer["response"]["status_code"] == 200 and answer["response"]["request_id"].startswith("req_")
    assert answer["response"]["body"] == {"object": "chat.completion"}
    error = error_line(LineError(4, "b", "invalid_url", "url must be ..."))
    assert error["response"] is None and error["error"] == {"code": "invalid_url", "message": "url must be ..."}
    assert "line" not in error
    anonymous = error_line(LineError(9, None, "invalid_json_line", "line 9 is not valid JSON"))
    assert anonymous["custom_id"] is None and anonymous["line"] == 9
    assert [output_key(line) for line in (answer, error, anonymous, {"custom_id": None})] == ["a", "b", 9, None]
