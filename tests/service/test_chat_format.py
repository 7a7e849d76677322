"""What a request's tools, tool_choice and reasoning fields make of the served model's chat format:
the constraint, the template variables, how the output is read back, and the refusals."""
from __future__ import annotations

import json

import pytest
from google.protobuf import json_format

from grammar.chat.reasoning import ReasoningMarkers
from grammar.chat.tool_calls import SYNTAXES, ToolCalls
from grammar.constraint import Constraint
from service._gen.formwork.v1 import generation_pb2 as pb
from service.chat_format import ChatFormat
from service.errors import ServiceError
from service.grpc.requests import chat_options_from_proto
from service.limits import ServiceLimits
from service.request import ChatOptions

LIMITS = ServiceLimits()
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
THINKING = ChatFormat("hermes", ReasoningMarkers("<think>", "</think>"), switches_thinking=True)


def request(**fields) -> ChatOptions:
    """The chat options of a formwork.v1 GenerateRequest with `fields`."""
    return chat_options_from_proto(json_format.ParseDict(
        {"chat": {"messages": [{"role": "user", "content": "hi"}]}, **fields}, pb.GenerateRequest()))


def tools(**fields) -> ChatOptions:
    return request(tools=[{"name": "get_weather", "description": "Weather", "parameters_json": json.dumps(WEATHER)},
                          {"name": "get_time"}], **fields)


def test_required_and_named_become_a_tool_calls_constraint():
    plan = ChatFormat().plan(tools(tool_choice={"mode": "TOOL_CHOICE_MODE_REQUIRED"}, parallel_tool_calls=False),
                             None, LIMITS)
    spec = ToolCalls.from_spec(plan.constraint.spec)
    assert plan.constraint.kind == "tool_calls"
    assert (spec.choice, spec.parallel, spec.syntax) == ("required", False, "hermes")
    assert [t.name for t in spec.tools] == ["get_weather", "get_time"] and spec.tools[0].parameters == WEATHER
    assert plan.shape.tool_syntax is SYNTAXES["hermes"] and plan.shape.reasoning is None
    assert plan.tools[0] == {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER,
                                                              "description": "Weather"}}
    named = ChatFormat("mistral").plan(tools(tool_choice={"function_name": "get_time"}), None, LIMITS)
    spec = ToolCalls.from_spec(named.constraint.spec)
    assert (spec.choice, spec.name, spec.syntax) == ("named", "get_time", "mistral")


def test_auto_is_the_default_and_none_leaves_the_output_free():
    assert ToolCalls.from_spec(ChatFormat().plan(tools(), None, LIMITS).constraint.spec).choice == "auto"
    none = ChatFormat().plan(tools(tool_choice={"mode": "TOOL_CHOICE_MODE_NONE"}), None, LIMITS)
    assert none.constraint is None and none.shape.plain and none.tools  # still shown to the model


def test_a_constraint_beside_auto_shapes_the_text_answer_and_is_moot_for_required():
    schema = Constraint("json_schema", json.dumps(WEATHER), strict=False, whitespace="compact")
    auto = ChatFormat().plan(tools(), schema, LIMITS).constraint
    spec = ToolCalls.from_spec(auto.spec)
    assert auto.kind == "tool_calls" and (auto.strict, auto.whitespace) == (False, "compact")
    assert spec.choice == "auto" and spec.answer == {"kind": "json_schema", "spec": schema.spec, "choices": []}
    required = ChatFormat().plan(tools(tool_choice={"mode": "TOOL_CHOICE_MODE_REQUIRED"}), schema, LIMITS).constraint
    assert ToolCalls.from_spec(required.spec).answer is None and required.strict is False
    with pytest.raises(ValueError, match="tool choice auto only"):
        ToolCalls(spec.tools, "required", answer={"kind": "json_object"}).validate()


@pytest.mark.parametrize("fields, constraint, message", [
    ({"tool_choice": {"function_name": "nope"}}, None, "tool_choice.function_name: 'nope' is not one of"),
    ({"tools": [{"name": "a b"}]}, None, "tools: tools[0].name 'a b' must be 1-64 letters"),
    ({"tools": [{"name": "f", "parameters_json": "[1]"}]}, None, 'tools[0].parameters_json: ("f") must be'),
    ({"tools": [{"name": "f", "parameters_json": "{"}]}, None, 'tools[0].parameters_json: ("f") is not valid JSON'),
    ({"tool_choice": {"mode": "TOOL_CHOICE_MODE_REQUIRED"}, "tools": []}, None, "tool_choice: required needs"),
    ({"reasoning": {"enabled": True}}, None, "reasoning.enabled: this model has no think markers (the server's "
                                             "--think-markers START,END sets them)"),
])
def test_refusals_name_the_field(fields, constraint, message):
    body = tools(**fields) if "tools" not in fields else request(**fields)
    with pytest.raises(ServiceError) as info:
        ChatFormat().plan(body, constraint, LIMITS)
    assert info.value.message.startswith(message), info.value.message


def test_reasoning_wraps_the_constraint_and_switches_the_template():
    plan = THINKING.plan(request(reasoning={"budget_tokens": 64}), Constraint("json_object"), LIMITS)
    assert (plan.constraint.kind, plan.constraint.think_end, plan.constraint.think_budget) == \
        ("json_object", "</think>", 64)
    assert plan.template_kwargs == {"enable_thinking": True} and plan.shape.reasoning == THINKING.reasoning
    free = THINKING.plan(request(), None, LIMITS)
    assert free.constraint is None and free.shape.reasoning is not None  # only split, nothing to enforce
    budget_only = THINKING.plan(request(reasoning={"budget_tokens": 8}), None, LIMITS)
    assert budget_only.constraint.kind == "regex" and budget_only.constraint.think_budget == 8
    off = THINKING.plan(request(reasoning={"enabled": False}), Constraint("json_object"), LIMITS)
    assert off.constraint == Constraint("json_object") and off.template_kwargs == {"enable_thinking": False}
    assert off.shape.plain
    with pytest.raises(ServiceError, match="cannot switch thinking off"):
        ChatFormat("hermes", THINKING.reasoning).plan(request(reasoning={"enabled": False}), None, LIMITS)


def test_template_kwargs_reach_the_template_and_enable_thinking_keeps_its_meaning():
    kwargs = {"enable_thinking": True, "custom": 1}
    no_markers = ChatFormat().plan(ChatOptions(thinking=True, template_kwargs=kwargs), None, LIMITS)
    assert no_markers.template_kwargs == kwargs and no_markers.shape.plain  # only the template's to read
    thinking = THINKING.plan(ChatOptions(thinking=True, template_kwargs={"custom": 1}), None, LIMITS)
    assert thinking.template_kwargs == {"custom": 1, "enable_thinking": True} and thinking.shape.reasoning
    off = THINKING.plan(ChatOptions(thinking=False, template_kwargs={"enable_thinking": False}), None, LIMITS)
    assert off.template_kwargs == {"enable_thinking": False} and off.shape.plain


def test_the_model_format_comes_from_its_family_and_the_server_overrides(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    qwen3 = ChatFormat.for_model(str(tmp_path), "{% if enable_thinking %}{% endif %}", LIMITS)
    assert qwen3 == ChatFormat("hermes", ReasoningMarkers("<think>", "</think>"), switches_thinking=True)
    overridden = ChatFormat.for_model(str(tmp_path), None, ServiceLimits(tool_call_syntax="llama3_json",
                                                                        no_reasoning=True))
    assert overridden.tool_syntax == "llama3_json" and overridden.reasoning is None
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert ChatFormat.for_model(str(tmp_path), "<|im_start|>", LIMITS) == ChatFormat()
