"""Tool calls through the `openai` SDK (and gRPC) against a live `formwork serve` on the real model:
call -> tool message -> answer, named choice streamed as OpenAI streams it, a bad tool schema
refused up front with the tool's name and the keyword's pointer."""
from __future__ import annotations

import json

import grpc
import jsonschema
import openai
import pytest
from google.protobuf import json_format
from openai.lib.streaming.chat import ChatCompletionStreamState

from live_server import error_of
from service._gen.formwork.v1 import generation_pb2 as pb
from weather_tools import ASK, TIME, weather_and_time_tools

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
TOOLS = weather_and_time_tools(WEATHER)


@pytest.fixture(scope="module")
def server(default_server):
    return default_server


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def test_required_call_then_tool_result_then_answer(client):
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=64, temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    schema = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), schema)

    messages = [*ASK, choice.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 21})}]
    answer = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="none",
                                            max_tokens=24, temperature=0)
    message = answer.choices[0].message
    assert message.content and not message.tool_calls
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens  # the call and its result were rendered


def test_named_choice_streams_the_call_as_openai_does(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False, max_tokens=48, temperature=0, stream=True)
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        choice = chunk.choices[0]
        for delta in choice.delta.tool_calls or []:
            entry = calls.setdefault(delta.index, {"id": delta.id, "name": "", "arguments": ""})
            entry["name"] += delta.function.name or ""
            entry["arguments"] += delta.function.arguments or ""
        assert not choice.delta.content  # only the call
        finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert [c["name"] for c in calls.values()] == ["get_time"]
    jsonschema.validate(json.loads(calls[0]["arguments"]), TIME)


def test_streamed_arguments_add_up_in_the_sdk_to_the_unary_call(client):
    kwargs = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                  max_tokens=64, temperature=0)
    unary = client.chat.completions.create(**kwargs).choices[0]
    state = ChatCompletionStreamState(input_tools=TOOLS)
    pieces = []
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        state.handle_chunk(chunk)
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            pieces.append(delta.function.arguments)
    streamed = state.get_final_completion().choices[0]
    assert pieces[0] == "" and len(pieces) > 2  # opened with its name, then the arguments piece by piece
    assert streamed.finish_reason == unary.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] == \
        [(c.function.name, c.function.arguments) for c in unary.message.tool_calls]


def test_auto_answers_in_text_or_calls_an_allowed_tool(client):
    response = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=64, temperature=0)
    message = response.choices[0].message
    for call in message.tool_calls or []:
        assert call.function.name in ("get_weather", "get_time")
        json.loads(call.function.arguments)
    assert message.content or message.tool_calls


def test_auto_beside_a_response_format_answers_in_its_shape_or_calls(client):
    answer = {"type": "object", "properties": {"reply": {"type": "string", "maxLength": 40}}, "required": ["reply"]}
    response_format = {"type": "json_schema", "json_schema": {"name": "reply", "schema": answer}}
    for question in ("What is the weather in Paris?", "Say hello."):
        message = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": question}], tools=TOOLS, parallel_tool_calls=False,
            response_format=response_format, max_tokens=64, temperature=0).choices[0].message
        if message.tool_calls:
            assert not message.content
            for call in message.tool_calls:
                jsonschema.validate(json.loads(call.function.arguments),
                                    {"get_weather": WEATHER, "get_time": TIME}[call.function.name])
        else:
            jsonschema.validate(json.loads(message.content), answer)
    required = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                              response_format=response_format, max_tokens=64, temperature=0)
    assert required.choices[0].message.tool_calls  # only calls: the response_format is moot


def test_a_bad_tool_schema_fails_up_front_naming_the_tool_and_the_pointer(client):
    bad = {"type": "function", "function": {"name": "tag_items", "parameters": {
        "type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=ASK, tools=[TOOLS[0], bad], tool_choice="required",
                                       max_tokens=8)
    message = info.value.body["message"]
    assert 'tools[1] "tag_items"' in message and "uniqueItems" in message and "/properties/tags" in message


def test_grpc_tools_and_parsed_calls(server):
    request = json_format.ParseDict({
        "chat": {"messages": ASK}, "max_tokens": 64, "temperature": 0, "parallel_tool_calls": False,
        "tools": [{"name": "get_weather", "parameters_json": json.dumps(WEATHER)}],
        "tool_choice": {"mode": "TOOL_CHOICE_MODE_REQUIRED"}}, pb.GenerateRequest())
    response = server.stub.Generate(request, timeout=120)
    [call] = response.tool_calls
    tokenized = server.stub.Tokenize(pb.TokenizeRequest(chat=request.chat, tools=request.tools), timeout=30)
    assert len(tokenized.token_ids) == response.usage.prompt_tokens  # the tools rendered as Generate renders them
    assert "get_weather" in tokenized.rendered_prompt
    assert call.name == "get_weather" and response.content == ""
    jsonschema.validate(json.loads(call.arguments_json), WEATHER)
    assert server.model_info().tool_call_syntax == "hermes"
    streamed = list(server.stub.GenerateStream(request, timeout=120))
    deltas = [d for r in streamed for d in r.tool_call_deltas]
    assert (deltas[0].index, deltas[0].name, deltas[0].arguments_delta) == (0, "get_weather", "")
    assert len(deltas) > 2 and not any(d.id or d.name for d in deltas[1:])
    [final] = streamed[-1].tool_calls
    assert final.id == deltas[0].id
    assert "".join(d.arguments_delta for d in deltas) == final.arguments_json == call.arguments_json
    error = error_of(server.stub.Generate, json_format.ParseDict(
        {"chat": {"messages": ASK}, "tools": [{"name": "get_weather"}], "tool_choice": {"function_name": "nope"}},
        pb.GenerateRequest()), timeout=30)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "tool_choice.function_name" in error.details()
