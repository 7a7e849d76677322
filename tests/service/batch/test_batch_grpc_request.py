"""A translated HTTP body sent over gRPC: the GenerateRequests decode (service/grpc/requests.py)
back into the request the HTTP front end would have run, one per prompt and choice."""
from __future__ import annotations

import dataclasses

import pytest

from service.batch_cli.grpc_request import generate_requests
from service.errors import ServiceError
from service.grpc.requests import generation_request_from_proto
from service.http.answerer import read_call

CHAT = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
                     {"role": "assistant", "content": "", "tool_calls": [
                         {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{\"city\": \"X\"}"}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
        "max_tokens": 20, "temperature": 0.5, "top_p": 0.9, "seed": 7, "stop": ["\n"], "logprobs": True,
        "top_logprobs": 2, "tools": [{"type": "function", "function": {"name": "w", "description": "weather",
                                                                       "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "w"}}, "parallel_tool_calls": False,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}}},
        "formwork": {"priority": 4, "whitespace": "compact", "jump_forward": False}}


def round_trip(path, body, num_prompts=1):
    translated = read_call(path, body, 1 << 20).translated
    sent = generate_requests(translated.request, translated.num_choices)
    assert len(sent) == num_prompts * translated.num_choices
    return translated.request, [generation_request_from_proto(r) for r in sent], sent


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", CHAT),
    ("/v1/responses", {"input": "hi", "instructions": "Be brief.", "max_output_tokens": 9,
                       "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}}),
    ("/v1/completions", {"prompt": "Once", "max_tokens": 5, "regex": "[a-z]+", "min_tokens": 2}),
    ("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 5, "structured_outputs": {"choice": ["a", "b"]}}),
    ("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "x"}], "tools": CHAT["tools"] + [
            {"type": "function", "function": {"name": "v", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "allowed_tools", "allowed_tools": {
            "mode": "required", "tools": [{"type": "function", "function": {"name": "v"}}]}}}),
    ("/v1/completions", {"prompt": "x", "formwork": {"grammar_backend": "llguidance"}, "response_format": {
        "type": "structural_tag", "format": {"type": "const_string", "value": "hi"}}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": CHAT["tools"],
                              "formwork": {"grammar_backend": "auto"}}),  # the tools' calls: no constraint
])
def test_the_requests_sent_decode_to_the_request_read(path, body):
    request, received, _ = round_trip(path, body)
    assert received == [request]


def test_several_prompts_and_choices_are_one_request_each_with_the_choices_seeds():
    request, received, sent = round_trip("/v1/completions", {"prompt": ["a", "b"], "n": 3, "seed": 10,
                                                              "max_tokens": 2}, num_prompts=2)
    assert [r.prompt for r in sent] == ["a", "a", "a", "b", "b", "b"]
    assert [r.seed for r in sent] == [10, 11, 12, 10, 11, 12]
    first = dataclasses.replace(request, prompts=request.prompts[:1])
    assert received[0] == first


def test_what_grpc_cannot_carry_is_refused_by_name():
    body = {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"custom": 1}}
    translated = read_call("/v1/chat/completions", body, 1 << 20).translated
    with pytest.raises(ServiceError, match="chat_template_kwargs.custom: cannot be sent to a gRPC server"):
        generate_requests(translated.request, 1)
