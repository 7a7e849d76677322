"""A request's grammar backend (gRPC's Constraint.grammar_backend and GenerateRequest.grammar_backend,
HTTP's formwork.grammar_backend): decoded to the same wire-neutral request, applied to every grammar
the request compiles (tool calls and think sections too), checked in one place, and the backend that served it
reported back (GenerateResponse, ValidateConstraintResponse, HTTP's `formwork` extension). Pure: no
server, no model."""
from __future__ import annotations

import pytest
from google.protobuf import json_format

from engine.frontend.output_processor import RequestOutput
from engine.protocol import ConstraintReport, FinishReason
from grammar.constraint import Constraint
from service._gen.formwork.v1 import generation_pb2 as pb
from service.errors import ErrorCode, ServiceError
from service.grpc import responses
from grammar.chat.reasoning import ReasoningMarkers
from service.chat_format import ChatFormat
from service.grpc.requests import chat_options_from_proto, constraint_from_proto
from service.http.conversion import translate_chat, translate_completion
from service.http.protocol import ChatCompletionRequest, CompletionRequest
from service.http.response_request import ResponsesRequest, translate_response_request
from service.http.responses import formwork_extension
from service.limits import ServiceLimits
from service.request import ConstraintRequest, GenerationRequest, SamplingRequest
from service.validation import engine_constraint, sampling_params, think_constraint

LIMITS = ServiceLimits()
VOCAB = 1000
SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}


def grpc_constraint(**fields) -> Constraint:
    return engine_constraint(constraint_from_proto(json_format.ParseDict(fields, pb.Constraint())), LIMITS)


@pytest.mark.parametrize("value, name", [
    (pb.GRAMMAR_BACKEND_AUTO, "auto"), (pb.GRAMMAR_BACKEND_XGRAMMAR, "xgrammar"),
    (pb.GRAMMAR_BACKEND_LLGUIDANCE, "llguidance"),
])
def test_grpc_backend_reaches_the_engine_constraint(value, name):
    assert grpc_constraint(regex="a+", grammar_backend=value) == Constraint("regex", "a+", grammar_backend=name)


def test_grpc_unset_or_unspecified_backend_is_the_servers():
    assert grpc_constraint(regex="a").grammar_backend == ""
    assert grpc_constraint(regex="a", grammar_backend=pb.GRAMMAR_BACKEND_UNSPECIFIED).grammar_backend == ""


def test_grpc_unknown_backend_number_names_the_field():
    with pytest.raises(ServiceError) as info:
        grpc_constraint(regex="a", grammar_backend=9)
    assert info.value.code == ErrorCode.INVALID_ARGUMENT
    assert [v.field for v in info.value.violations] == ["constraint.grammar_backend"]
    assert "unknown value 9" in info.value.message


def test_validation_refuses_an_unknown_backend_by_name():
    with pytest.raises(ServiceError) as info:
        engine_constraint(ConstraintRequest("regex", "a", grammar_backend="outlines"), LIMITS)
    assert [v.field for v in info.value.violations] == ["constraint.grammar_backend"]
    assert "'outlines'" in info.value.message and "auto, xgrammar, llguidance" in info.value.message


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})


def test_http_backend_is_a_formwork_option_on_every_endpoint():
    chat_request = translate_chat(chat(response_format={"type": "json_object"},
                                       formwork={"grammar_backend": "llguidance"})).request
    completion = translate_completion(CompletionRequest.model_validate(
        {"prompt": "hi", "guided_regex": "a+", "formwork": {"grammar_backend": "auto"}})).request
    response = translate_response_request(ResponsesRequest.model_validate(
        {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": SCHEMA}},
         "formwork": {"grammar_backend": "xgrammar"}})).request
    assert sampling_params(chat_request, LIMITS, VOCAB).constraint.grammar_backend == "llguidance"
    assert sampling_params(completion, LIMITS, VOCAB).constraint.grammar_backend == "auto"
    assert sampling_params(response, LIMITS, VOCAB).constraint.grammar_backend == "xgrammar"
    unset = translate_chat(chat(response_format={"type": "json_object"})).request
    assert sampling_params(unset, LIMITS, VOCAB).constraint.grammar_backend == ""


@pytest.mark.parametrize("translate, body", [
    (lambda body: translate_chat(chat(**body)), {"guided_regex": "a"}),
    (lambda body: translate_response_request(ResponsesRequest.model_validate({"input": "hi", **body})),
     {"text": {"format": {"type": "json_object"}}}),
])
def test_http_unknown_backend_is_refused_naming_its_field(translate, body):
    translated = translate({**body, "formwork": {"grammar_backend": "guidance"}})
    with pytest.raises(ServiceError) as info:
        sampling_params(translated.request, LIMITS, VOCAB)
    renamed, param = translated.field_names.rename(info.value)
    assert param == "formwork.grammar_backend"
    assert renamed.message.startswith("formwork.grammar_backend: unknown grammar backend 'guidance'")


WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
THINKING = ChatFormat("hermes", ReasoningMarkers("<think>", "</think>"), switches_thinking=True)


def planned(request: GenerationRequest, chat_format: ChatFormat = ChatFormat()) -> Constraint | None:
    """The one grammar the request compiles, as the server plans it (tools and reasoning included)."""
    params = sampling_params(request, LIMITS, VOCAB)
    return chat_format.plan(request.chat, params.constraint, LIMITS, think_constraint(request, LIMITS)).constraint


def test_http_backend_applies_to_tool_calls_without_a_constraint():
    request = translate_chat(chat(tools=[WEATHER_TOOL], tool_choice="required",
                                  formwork={"grammar_backend": "llguidance"})).request
    constraint = planned(request)
    assert constraint.kind == "tool_calls" and constraint.grammar_backend == "llguidance"
    response = translate_response_request(ResponsesRequest.model_validate(
        {"input": "hi", "tools": [{"type": "function", **WEATHER_TOOL["function"]}],
         "formwork": {"grammar_backend": "xgrammar"}})).request
    assert planned(response).grammar_backend == "xgrammar"


def test_http_backend_applies_to_the_think_section_and_what_follows_it():
    budget = translate_chat(chat(formwork={"grammar_backend": "xgrammar", "reasoning_budget": 16})).request
    assert planned(budget, THINKING).grammar_backend == "xgrammar"  # the think budget's any-text grammar
    think = translate_chat(chat(tools=[WEATHER_TOOL], formwork={
        "grammar_backend": "llguidance", "reasoning_format": {"regex": "[a-z ]+"}})).request
    constraint = planned(think, THINKING)
    assert constraint.kind == "tool_calls" and constraint.think is not None
    assert constraint.grammar_backend == "llguidance"  # one grammar: the think section's is compiled with it


def test_http_backend_with_nothing_to_compile_is_refused_naming_its_field():
    translated = translate_chat(chat(formwork={"grammar_backend": "llguidance"}))
    with pytest.raises(ServiceError) as info:
        planned(translated.request)
    renamed, param = translated.field_names.rename(info.value)
    assert param == "formwork.grammar_backend" and "needs a grammar" in renamed.message
    unknown = translate_chat(chat(tools=[WEATHER_TOOL], formwork={"grammar_backend": "guidance"}))
    with pytest.raises(ServiceError) as info:
        planned(unknown.request)
    assert unknown.field_names.rename(info.value)[1] == "formwork.grammar_backend"


def grpc_request(**fields) -> GenerationRequest:
    message = json_format.ParseDict({"chat": {"messages": [{"role": "user", "content": "hi"}]}, **fields},
                                    pb.GenerateRequest())
    constraint = constraint_from_proto(message.constraint) if message.HasField("constraint") else None
    return GenerationRequest((), SamplingRequest(), constraint, chat_options_from_proto(message))


GRPC_TOOL = {"name": "get_weather", "parameters_json": '{"type": "object", "properties": {"city": {"type": "string"}}}'}


def test_grpc_request_backend_applies_to_tool_calls_and_agrees_with_the_constraints():
    calls = planned(grpc_request(tools=[GRPC_TOOL], grammar_backend="GRAMMAR_BACKEND_LLGUIDANCE"))
    assert calls.kind == "tool_calls" and calls.grammar_backend == "llguidance"
    same = planned(grpc_request(tools=[GRPC_TOOL], grammar_backend="GRAMMAR_BACKEND_AUTO",
                                constraint={"regex": "a+", "grammar_backend": "GRAMMAR_BACKEND_AUTO"}))
    assert same.grammar_backend == "auto"
    with pytest.raises(ServiceError) as info:
        planned(grpc_request(grammar_backend="GRAMMAR_BACKEND_XGRAMMAR",
                             constraint={"regex": "a+", "grammar_backend": "GRAMMAR_BACKEND_LLGUIDANCE"}))
    assert [v.field for v in info.value.violations] == ["grammar_backend"]
    with pytest.raises(ServiceError) as info:
        grpc_request(tools=[GRPC_TOOL], grammar_backend=9)
    assert [v.field for v in info.value.violations] == ["grammar_backend"] and "unknown value 9" in info.value.message


def final_output(**fields) -> RequestOutput:
    return RequestOutput(request_id="r", text="a", delta_text="a", token_ids=[5, 2], new_token_ids=[5, 2],
                         finished=True, finish_reason=FinishReason.STOP, num_prompt_tokens=3, num_output_tokens=2,
                         **fields)


def test_the_serving_backend_is_reported_on_the_final_response():
    served = responses.generate_response(final_output(grammar_backend="llguidance"), "r", str, delta=False)
    assert served.grammar_backend == pb.GRAMMAR_BACKEND_LLGUIDANCE
    unconstrained = responses.generate_response(final_output(), "r", str, delta=False)
    assert unconstrained.grammar_backend == pb.GRAMMAR_BACKEND_UNSPECIFIED
    assert formwork_extension([final_output(grammar_backend="xgrammar")])["choices"][0]["grammar_backend"] == "xgrammar"
    assert "grammar_backend" not in formwork_extension([final_output()])["choices"][0]


def test_validate_constraint_reports_its_backend():
    report = ConstraintReport(ok=True, compile_s=0.01, backend="llguidance")
    assert responses.validate_constraint_response(report).grammar_backend == pb.GRAMMAR_BACKEND_LLGUIDANCE
    failed = responses.validate_constraint_response(ConstraintReport(ok=False, error="bad"))
    assert failed.grammar_backend == pb.GRAMMAR_BACKEND_UNSPECIFIED
