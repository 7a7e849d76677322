"""Structural tags on the wire: HTTP response_format / structured_outputs / Responses text.format and
gRPC's Constraint.structural_tag become one wire-neutral constraint, and a malformed tag is a 400 /
INVALID_ARGUMENT naming the field inside it, the server serving on. Fake engine core: no model."""
from __future__ import annotations

import json

import grpc
import httpx
import pytest

from live_server import error_of, field_violations
from service._gen.formwork.v1 import generation_pb2 as pb
from service._gen.formwork.v1 import generation_pb2_grpc as pb_grpc
from service.errors import ServiceError
from service.grpc.requests import constraint_from_proto
from service.http.conversion import translate_chat, translate_completion
from service.http.protocol import ChatCompletionRequest, CompletionRequest
from service.http.response_request import ResponsesRequest, translate_response_request
from service.limits import ServiceLimits
from service.validation import engine_constraint, sampling_params

FORMAT = {"type": "triggered_tags", "triggers": ["<f="],
          "tags": [{"type": "tag", "begin": "<f=a>", "content": {"type": "json_schema", "json_schema": {
              "type": "object"}}, "end": "</f>"}]}
TAG = {"type": "structural_tag", "format": FORMAT}
LEGACY = {"type": "structural_tag", "triggers": ["<f="],
          "structures": [{"begin": "<f=a>", "schema": {"type": "object"}, "end": "</f>"}]}
BAD_TRIGGER = dict(FORMAT, triggers=["<f=", "<g="])
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({**CHAT, **fields})


def http_error(translated) -> tuple[str | None, str]:
    """(param, message) of the error the shared validation gives `translated`'s request."""
    with pytest.raises(ServiceError) as info:
        sampling_params(translated.request, ServiceLimits(), 1000)
    renamed, param = translated.field_names.rename(info.value)
    return param, renamed.message


@pytest.mark.parametrize("tag", [TAG, LEGACY])
def test_every_http_field_carries_the_tag_as_sent(tag):
    requests = [translate_chat(chat(response_format=tag)),
                translate_chat(chat(structured_outputs={"structural_tag": tag})),
                translate_chat(chat(structured_outputs={"structural_tag": json.dumps(tag)})),  # vLLM: JSON text
                translate_completion(CompletionRequest.model_validate({"prompt": "x", "response_format": tag})),
                translate_response_request(ResponsesRequest.model_validate({"input": "hi", "text": {"format": tag}}))]
    for translated in requests:
        constraint = translated.request.constraint
        assert constraint.kind == "structural_tag" and json.loads(constraint.spec) == tag
        assert sampling_params(translated.request, ServiceLimits(), 1000).constraint.kind == "structural_tag"


def test_the_formwork_options_apply_to_the_schemas_inside():
    translated = translate_chat(chat(response_format=TAG, formwork={"strict": False, "whitespace": "compact"}))
    constraint = sampling_params(translated.request, ServiceLimits(), 1000).constraint
    assert (constraint.strict, constraint.whitespace) == (False, "compact")


@pytest.mark.parametrize(("fields", "param", "message"), [
    ({"response_format": {"type": "structural_tag", "format": BAD_TRIGGER}}, "response_format.format.triggers[1]",
     "'<g=' is not the start of any tag's begin"),
    ({"response_format": dict(LEGACY, triggers=["<x"])}, "response_format.structures[0].begin",
     "'<f=a>' starts with none of the triggers"),
    ({"structured_outputs": {"structural_tag": {"format": {"type": "tagg"}}}},
     "structured_outputs.structural_tag.format.type", "unknown format type 'tagg'"),
    ({"structured_outputs": {"structural_tag": "{not json"}}, "structured_outputs.structural_tag", "is not valid JSON"),
    ({"response_format": {"type": "structural_tag"}}, "response_format", 'needs "format"'),
])
def test_a_malformed_tag_is_a_400_naming_the_field_inside_it(fields, param, message):
    found_param, found_message = http_error(translate_chat(chat(**fields)))
    assert found_param == param
    assert found_message.startswith(f"{param}: {message}")


def test_responses_names_text_format():
    translated = translate_response_request(ResponsesRequest.model_validate(
        {"input": "hi", "text": {"format": {"type": "structural_tag", "format": BAD_TRIGGER}}}))
    assert http_error(translated)[0] == "text.format.format.triggers[1]"


def test_tag_fields_belong_to_type_structural_tag():
    with pytest.raises(ServiceError, match=r"^response_format\.format: belongs to type structural_tag"):
        translate_chat(chat(response_format={"type": "json_object", "format": FORMAT}))
    with pytest.raises(ServiceError, match="set exactly one of json, regex, choice, grammar, json_object, structural"):
        translate_chat(chat(structured_outputs={"structural_tag": TAG, "regex": "a"}))


def test_grpc_constraint_and_its_errors():
    request = constraint_from_proto(pb.Constraint(structural_tag=json.dumps(TAG), strict=False))
    assert (request.kind, json.loads(request.spec), request.strict) == ("structural_tag", TAG, False)
    bad = constraint_from_proto(pb.Constraint(structural_tag=json.dumps({"format": BAD_TRIGGER})))
    with pytest.raises(ServiceError) as info:
        engine_constraint(bad, ServiceLimits())
    assert info.value.violations[0].field == "constraint.structural_tag.format.triggers[1]"


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def test_a_tag_beside_tools_joins_the_calls(make_http_server):
    server = make_http_server()
    response = httpx.post(f"{server.url}/v1/chat/completions", json={**CHAT, "response_format": TAG, "tools": TOOLS})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(("tag", "param"), [
    ({"type": "structural_tag", "format": dict(FORMAT, triggers=["<tool"], tags=[
        dict(FORMAT["tags"][0], begin="<tool>")])}, "response_format.format.triggers[0]"),
    ({"type": "structural_tag", "triggers": ["<tool_call>"],
      "structures": [{"begin": "<tool_call>x", "schema": {}, "end": "</x>"}]}, "response_format.triggers[0]"),
])
def test_a_tag_trigger_that_clashes_with_the_calls_is_a_400_naming_it(make_http_server, tag, param):
    server = make_http_server()
    response = httpx.post(f"{server.url}/v1/chat/completions", json={**CHAT, "response_format": tag, "tools": TOOLS})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert "clashes with the tool calls' trigger '<tool_call>' (hermes syntax)" in response.json()["error"]["message"]
    assert httpx.post(f"{server.url}/v1/chat/completions", json={**CHAT, "response_format": TAG,
                                                                 "tools": TOOLS}).status_code == 200


def test_both_front_ends_refuse_a_bad_tag_and_serve_on(make_http_server):
    server = make_http_server()
    body = {**CHAT, "response_format": {"type": "structural_tag", "format": BAD_TRIGGER}}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "response_format.format.triggers[1]"
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = pb_grpc.GenerationStub(channel)
        bad = pb.GenerateRequest(prompt="hi", max_tokens=4,
                                 constraint=pb.Constraint(structural_tag=json.dumps({"format": BAD_TRIGGER})))
        error = error_of(stub.Generate, bad, timeout=10)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert list(field_violations(error)) == ["constraint.structural_tag.format.triggers[1]"]
        good = pb.GenerateRequest(prompt="hi", max_tokens=4, constraint=pb.Constraint(structural_tag=json.dumps(TAG)))
        assert stub.Generate(good, timeout=10).usage.completion_tokens > 0
    assert httpx.post(f"{server.url}/v1/chat/completions", json={**CHAT, "response_format": TAG}).status_code == 200
