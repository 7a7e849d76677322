"""The Python client's GenerateRequest: the request-wide grammar backend."""
from __future__ import annotations

import pytest
from formwork_client._gen.formwork.v1 import generation_pb2 as pb
from formwork_client.request import generate_request

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def test_the_grammar_backend_is_set_for_the_whole_request_with_or_without_a_constraint():
    tools_only = generate_request(messages=[{"role": "user", "content": "hi"}], tools=[WEATHER],
                                  grammar_backend="llguidance")
    assert tools_only.grammar_backend == pb.GRAMMAR_BACKEND_LLGUIDANCE and not tools_only.HasField("constraint")
    assert not generate_request("hi").HasField("grammar_backend")  # the server's choice
    with pytest.raises(ValueError, match="auto, xgrammar, llguidance"):
        generate_request("hi", grammar_backend="guidance")
