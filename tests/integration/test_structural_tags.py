"""Structural tags on the real model, over HTTP (the openai SDK) and gRPC: the text between each
tag's begin and end parses and validates against its schema; a malformed tag, or a schema inside
one that does not compile, is a 400 / INVALID_ARGUMENT naming the field, and the server serves on."""
from __future__ import annotations

import json
import re

import grpc
import jsonschema
import openai
import pytest

from live_server import error_of, field_violations
from service._gen.formwork.v1 import generation_pb2 as pb

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
BEGIN, END = "<function=get_weather>", "</function>"
CALL = {"type": "tag", "begin": BEGIN, "content": {"type": "json_schema", "json_schema": WEATHER}, "end": END}
# the call comes first (at_least_one), and once (stop_after_first)
ONE_CALL = {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<function="],
                                                 "tags": [CALL], "at_least_one": True, "stop_after_first": True}}
LEGACY = {"type": "structural_tag", "triggers": ["<function="],
          "structures": [{"begin": BEGIN, "schema": WEATHER, "end": END}]}
ASK = [{"role": "user", "content": "What is the weather in Paris? Call get_weather."}]
# a few calls shown in the prompt, so that the model writes one in free text
FEW_SHOT = (f'Weather questions are answered with a call.\nQ: Rome?\nA: {BEGIN}{{"city": "Rome", "unit": "celsius"}}'
            f'{END}\nQ: Boston?\nA: {BEGIN}{{"city": "Boston", "unit": "fahrenheit"}}{END}\nQ: Paris?\nA:')


@pytest.fixture(scope="module")
def client(default_server):
    with openai.OpenAI(base_url=f"{default_server.http_url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def tagged_calls(text: str) -> list[dict]:
    """Each tag's content, parsed and validated against WEATHER."""
    contents = re.findall(re.escape(BEGIN) + "(.*?)" + re.escape(END), text, re.DOTALL)
    calls = [json.loads(content) for content in contents]
    for call in calls:
        jsonschema.validate(call, WEATHER)
    return calls


def test_http_chat_a_call_in_its_schema(client):
    answer = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=60, temperature=0,
                                            response_format=ONE_CALL)
    text = answer.choices[0].message.content
    assert text.startswith(BEGIN) and text.endswith(END), text
    assert len(tagged_calls(text)) == 1


def test_http_completion_free_text_then_the_triggered_call(client):
    answer = client.completions.create(model=MODEL, prompt=FEW_SHOT, max_tokens=40, temperature=0,
                                       extra_body={"structured_outputs": {"structural_tag": json.dumps(LEGACY)}})
    text = answer.choices[0].text
    assert len(tagged_calls(text)) >= 1, text


def test_grpc_a_call_in_its_schema(default_server):
    request = pb.GenerateRequest(chat=pb.Chat(messages=[pb.ChatMessage(role="user", content=ASK[0]["content"])]),
                                 max_tokens=60, temperature=0,
                                 constraint=pb.Constraint(structural_tag=json.dumps(ONE_CALL)))
    response = default_server.stub.Generate(request, timeout=120)
    assert response.finish_reason == pb.FINISH_REASON_STOP
    assert response.text.startswith(BEGIN) and len(tagged_calls(response.text)) == 1


def test_bad_tags_are_refused_by_field_and_the_server_serves_on(client, default_server):
    bad_trigger = {"type": "structural_tag", "format": dict(ONE_CALL["format"], triggers=["<function=", "<tool>"])}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, response_format=bad_trigger)
    assert info.value.body["param"] == "response_format.format.triggers[1]"
    bad_schema = {"type": "structural_tag", "format": dict(ONE_CALL["format"], tags=[
        dict(CALL, content={"type": "json_schema", "json_schema": {"type": "strin"}})])}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, response_format=bad_schema)
    assert info.value.body["param"] == "response_format"
    assert info.value.body["message"].startswith(
        "response_format: format.tags[0].content.json_schema: json_schema does not compile")
    legacy_mismatch = pb.Constraint(structural_tag=json.dumps(dict(LEGACY, triggers=["<tool="])))
    error = error_of(default_server.stub.Generate, pb.GenerateRequest(prompt="x", max_tokens=4,
                                                                      constraint=legacy_mismatch), timeout=60)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert list(field_violations(error)) == ["constraint.structural_tag.structures[0].begin"]
    answer = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=60, temperature=0,
                                            response_format=ONE_CALL)
    assert len(tagged_calls(answer.choices[0].message.content)) == 1


TIME_TOOL = {"type": "function", "function": {"name": "get_time", "description": "The time in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
    "additionalProperties": False}}}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_http_chat_a_structural_tag_beside_tools_gives_a_tag_or_a_call(client, stream):
    """The tag's triggers and the tools' join: the answer starts with one of either kind
    (at_least_one) and stops there; a call comes back in tool_calls with valid arguments, the
    tag's part stays in content."""
    fields = dict(model=MODEL, messages=ASK, max_tokens=60, temperature=0, response_format=ONE_CALL,
                  tools=[TIME_TOOL])
    if stream:
        content, calls = "", {}
        for chunk in client.chat.completions.create(**fields, stream=True):
            delta = chunk.choices[0].delta if chunk.choices else None
            content += (delta.content or "") if delta else ""
            for call in (delta.tool_calls or []) if delta else []:
                entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
        calls = list(calls.values())
    else:
        message = client.chat.completions.create(**fields).choices[0].message
        content = message.content or ""
        calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls or []]
    tags = tagged_calls(content)
    assert len(tags) + len(calls) == 1, (content, calls)
    for call in calls:
        assert call["name"] == "get_time"
        jsonschema.validate(json.loads(call["arguments"]), TIME_TOOL["function"]["parameters"])


def test_http_responses_stream_with_a_structural_tag(client):
    """/v1/responses streamed through the SDK's responses.stream, text.format a structural tag:
    the text deltas add up to the final output, which holds one call in its schema."""
    with client.responses.stream(model=MODEL, input=ASK[0]["content"], max_output_tokens=60, temperature=0,
                                 text={"format": ONE_CALL}) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text and final.status == "completed"
    assert final.output_text.startswith(BEGIN) and len(tagged_calls(final.output_text)) == 1
