"""tool_choice allowed_tools (OpenAI's chat and Responses shapes, gRPC's ToolChoice.allowed_tools,
the Python and Node clients' builders): only the listed tools may be called, every tool is still
shown to the model, and an unknown name is an error naming the field. No model."""
from __future__ import annotations

import json
import subprocess

import pytest
from google.protobuf import json_format
from grammar_factories import accepts, make_backend

from formwork_client import pb as client_pb
from formwork_client.tools import to_tool_choice
from grammar.chat.tool_calls import Tool, ToolCalls
from grammar.constraint import Constraint
from live_server import REPO_ROOT
from service._gen.formwork.v1 import generation_pb2 as pb
from service.chat_format import ChatFormat
from service.errors import ServiceError
from service.grpc.requests import chat_options_from_proto
from service.http.conversion import translate_chat
from service.http.protocol import ChatCompletionRequest
from service.http.response_request import ResponsesRequest, translate_response_request
from service.limits import ServiceLimits

LIMITS = ServiceLimits()
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TIME = {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
              {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "parameters": WEATHER},
                   {"type": "function", "name": "get_time", "parameters": TIME}]
CALL_WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CALL_TIME = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'


def chat_allowed(mode: str, *names: str) -> ChatCompletionRequest:
    choice = {"type": "allowed_tools", "allowed_tools": {
        "mode": mode, "tools": [{"type": "function", "function": {"name": n}} for n in names]}}
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "tools": CHAT_TOOLS,
                                                 "tool_choice": choice})


def planned(translated):
    """The ToolCalls spec and the template's tools of a translated request, or the renamed error."""
    try:
        plan = ChatFormat().plan(translated.request.chat, None, LIMITS)
    except ServiceError as e:
        return translated.field_names.rename(e)
    return ToolCalls.from_spec(plan.constraint.spec), [t["function"]["name"] for t in plan.tools]


def test_chat_allowed_tools_restrict_the_calls_not_the_prompt():
    spec, shown = planned(translate_chat(chat_allowed("required", "get_time")))
    assert (spec.choice, spec.allowed, [t.name for t in spec.allowed_tools]) == ("required", ("get_time",),
                                                                                ["get_time"])
    assert shown == ["get_weather", "get_time"]
    spec, _ = planned(translate_chat(chat_allowed("auto", "get_weather", "get_time")))
    assert spec.choice == "auto" and spec.allowed == ("get_weather", "get_time")


def test_responses_allowed_tools():
    body = ResponsesRequest.model_validate({"input": "hi", "tools": RESPONSES_TOOLS, "tool_choice": {
        "type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "get_weather"}]}})
    spec, shown = planned(translate_response_request(body))
    assert (spec.choice, spec.allowed, shown) == ("auto", ("get_weather",), ["get_weather", "get_time"])


@pytest.mark.parametrize(("translated", "param", "message"), [
    (lambda: translate_chat(chat_allowed("required", "get_time", "get_tide")), "tool_choice.allowed_tools.tools[1]",
     "'get_tide' is not one of the request's tools"),
    (lambda: translate_response_request(ResponsesRequest.model_validate({
        "input": "hi", "tools": RESPONSES_TOOLS,
        "tool_choice": {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "x"}]}})),
     "tool_choice.tools[0]", "'x' is not one of the request's tools"),
])
def test_an_unknown_tool_name_is_an_error_naming_the_field(translated, param, message):
    error, found = planned(translated())
    assert found == param and error.message == f"{param}: {message}"


def test_malformed_allowed_tools_are_refused_by_field():
    with pytest.raises(ServiceError, match=r"^tool_choice\.allowed_tools\.tools: must name at least one tool"):
        translate_chat(chat_allowed("auto"))
    other = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "tools": CHAT_TOOLS,
                                                  "tool_choice": {"type": "allowed_tools", "allowed_tools": {
                                                      "mode": "auto", "tools": [{"type": "mcp"}]}}})
    with pytest.raises(ServiceError, match=r"^tool_choice\.allowed_tools\.tools\[0\]\.type: only function tools"):
        translate_chat(other)


def grpc_options(tool_choice: dict):
    return chat_options_from_proto(json_format.ParseDict(
        {"chat": {"messages": [{"role": "user", "content": "hi"}]}, "tool_choice": tool_choice,
         "tools": [{"name": "get_weather", "parameters_json": json.dumps(WEATHER)}, {"name": "get_time"}]},
        pb.GenerateRequest()))


def test_grpc_allowed_tools():
    options = grpc_options({"allowed_tools": {"mode": "TOOL_CHOICE_MODE_REQUIRED", "function_names": ["get_time"]}})
    assert (options.tool_choice, options.allowed_tools) == ("required", ("get_time",))
    assert grpc_options({"allowed_tools": {"function_names": ["get_time"]}}).tool_choice == "auto"  # unset: auto
    with pytest.raises(ServiceError, match=r"^tool_choice\.allowed_tools\.mode: must be"):
        grpc_options({"allowed_tools": {"mode": "TOOL_CHOICE_MODE_NONE", "function_names": ["get_time"]}})
    with pytest.raises(ServiceError, match=r"^tool_choice\.allowed_tools\.function_names: must name at least one"):
        grpc_options({"allowed_tools": {"mode": "TOOL_CHOICE_MODE_AUTO"}})
    with pytest.raises(ServiceError, match=r"^tool_choice\.allowed_tools\.function_names\[0\]: 'get_tide' is not"):
        ChatFormat().plan(grpc_options({"allowed_tools": {"function_names": ["get_tide"]}}), None, LIMITS)


def test_the_grammar_takes_only_calls_of_the_allowed_tools():
    tools = (Tool("get_weather", "", WEATHER), Tool("get_time", "", TIME))
    required = make_backend().compile(Constraint("tool_calls", ToolCalls(tools, "required",
                                                                         allowed=("get_time",)).to_spec()))
    assert accepts(required, CALL_TIME)
    assert not accepts(required, CALL_WEATHER)
    auto = make_backend().compile(Constraint("tool_calls", ToolCalls(tools, "auto", allowed=("get_weather",)).to_spec()))
    assert accepts(auto, "Sure. " + CALL_WEATHER)
    assert not accepts(auto, "Sure. " + CALL_TIME)
    with pytest.raises(ValueError, match=r"allowed\[0\] 'get_tide' is not one of the tools"):
        ToolCalls(tools, "auto", allowed=("get_tide",)).validate()


def test_the_clients_build_allowed_tools():
    openai_shape = {"type": "allowed_tools", "allowed_tools": {
        "mode": "required", "tools": [{"type": "function", "function": {"name": "get_time"}}]}}
    responses_shape = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_time"}]}
    expected = client_pb.ToolChoice(allowed_tools=client_pb.AllowedTools(mode=client_pb.TOOL_CHOICE_MODE_REQUIRED,
                                                                         function_names=["get_time"]))
    assert to_tool_choice(openai_shape) == expected and to_tool_choice(responses_shape) == expected
    # the Node client: its own shape, and the same two OpenAI shapes
    script = f"""
      import {{ toolChoice }} from "./clients/node/src/tools.js";
      const shapes = [{{ allowed: ["get_time"], mode: "required" }}, {json.dumps(openai_shape)},
                      {json.dumps(responses_shape)}];
      console.log(JSON.stringify(shapes.map(toolChoice)));
    """
    node = subprocess.run(["node", "--input-type=module", "-e", script], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60)
    assert node.returncode == 0, node.stderr
    assert json.loads(node.stdout) == 3 * [{"allowed_tools": {"mode": "TOOL_CHOICE_MODE_REQUIRED",
                                                              "function_names": ["get_time"]}}]
