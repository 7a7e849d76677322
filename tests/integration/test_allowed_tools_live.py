"""tool_choice allowed_tools on the real model, with the openai SDK (chat and Responses) and over
gRPC: asked about the weather with only get_time allowed, the model calls get_time, its arguments in
get_time's schema; an unknown name is a 400 / INVALID_ARGUMENT naming the field."""
from __future__ import annotations

import json

import grpc
import jsonschema
import openai
import pytest

from live_server import error_of, field_violations
from service._gen.formwork.v1 import generation_pb2 as pb
from weather_tools import ASK, TIME, weather_and_time_tools

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"]}
TOOLS = weather_and_time_tools(WEATHER)


@pytest.fixture(scope="module")
def client(default_server):
    with openai.OpenAI(base_url=f"{default_server.http_url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def allowed(*names: str, mode: str = "required") -> dict:
    return {"type": "allowed_tools", "allowed_tools": {
        "mode": mode, "tools": [{"type": "function", "function": {"name": name}} for name in names]}}


def test_chat_calls_only_an_allowed_tool(client):
    answer = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=allowed("get_time"),
                                            parallel_tool_calls=False, max_tokens=64, temperature=0)
    [call] = answer.choices[0].message.tool_calls
    assert call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), TIME)


def test_responses_calls_only_an_allowed_tool(client):
    tools = [{"type": "function", **tool["function"]} for tool in TOOLS]
    response = client.responses.create(model=MODEL, input=ASK[0]["content"], tools=tools, max_output_tokens=64,
                                       temperature=0, parallel_tool_calls=False, tool_choice={
                                           "type": "allowed_tools", "mode": "required",
                                           "tools": [{"type": "function", "name": "get_time"}]})
    calls = [item for item in response.output if item.type == "function_call"]
    assert [call.name for call in calls] == ["get_time"]
    jsonschema.validate(json.loads(calls[0].arguments), TIME)


def test_grpc_calls_only_an_allowed_tool(default_server):
    request = pb.GenerateRequest(
        chat=pb.Chat(messages=[pb.ChatMessage(role="user", content=ASK[0]["content"])]), max_tokens=64, temperature=0,
        tools=[pb.Tool(name=t["function"]["name"], parameters_json=json.dumps(t["function"]["parameters"]))
               for t in TOOLS],
        tool_choice=pb.ToolChoice(allowed_tools=pb.AllowedTools(mode=pb.TOOL_CHOICE_MODE_REQUIRED,
                                                                function_names=["get_time"])),
        parallel_tool_calls=False)
    response = default_server.stub.Generate(request, timeout=120)
    assert [call.name for call in response.tool_calls] == ["get_time"]
    jsonschema.validate(json.loads(response.tool_calls[0].arguments_json), TIME)


def test_an_unknown_allowed_tool_is_refused_by_field(client, default_server):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=allowed("get_tide"),
                                       max_tokens=8)
    assert info.value.body["param"] == "tool_choice.allowed_tools.tools[0]"
    request = pb.GenerateRequest(prompt="x", max_tokens=4, tools=[pb.Tool(name="get_time")],
                                 tool_choice=pb.ToolChoice(allowed_tools=pb.AllowedTools(function_names=["get_tide"])))
    error = error_of(default_server.stub.Generate, request, timeout=60)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert list(field_violations(error)) == ["tool_choice.allowed_tools.function_names[0]"]
