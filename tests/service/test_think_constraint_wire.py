"""The think section's own constraint on both wires (gRPC reasoning.think_constraint, HTTP
formwork.reasoning_format), composed by the chat format, and the refusals, each naming its field."""
from __future__ import annotations

import json

import grpc
import httpx
import pytest
from google.protobuf import json_format

from grammar.chat.reasoning import ReasoningMarkers
from grammar.constraint import ANY_TEXT, Constraint
from service._gen.formwork.v1 import generation_pb2 as pb
from service._gen.formwork.v1 import generation_pb2_grpc as pb_grpc
from service.chat_format import ChatFormat
from service.errors import ServiceError
from service.grpc.requests import chat_options_from_proto
from service.http.conversion import translate_chat
from service.http.protocol import ChatCompletionRequest
from service.http.response_request import ResponsesRequest, translate_response_request
from service.limits import ServiceLimits
from service.request import GenerationRequest
from service.validation import think_constraint

LIMITS = ServiceLimits()
THINKING = ChatFormat("hermes", ReasoningMarkers("<think>", "</think>"), switches_thinking=True)
STEPS = r"(\d\. [^\n]{1,40}\n){1,4}"


def grpc_request(**reasoning) -> GenerationRequest:
    options = chat_options_from_proto(json_format.ParseDict(
        {"chat": {"messages": [{"role": "user", "content": "hi"}]}, "reasoning": reasoning}, pb.GenerateRequest()))
    return GenerationRequest((), chat=options)


def http_request(**fields):
    return translate_chat(ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], **fields}))


def planned(request: GenerationRequest, constraint: Constraint | None = None, chat_format: ChatFormat = THINKING):
    return chat_format.plan(request.chat, constraint, LIMITS, think_constraint(request, LIMITS)).constraint


def test_grpc_think_constraint_goes_before_the_end_marker_and_the_answer_after():
    composed = planned(grpc_request(think_constraint={"regex": STEPS}), Constraint("json_object"))
    assert (composed.kind, composed.think_end, composed.think_start) == ("json_object", "</think>", "<think>")
    assert composed.think == Constraint("regex", STEPS)
    free_answer = planned(grpc_request(think_constraint={"choice": {"choices": ["ok"]}}))
    assert free_answer.spec == ANY_TEXT and free_answer.think.choices == ["ok"]


def test_grpc_think_constraint_keeps_its_own_options():
    composed = planned(grpc_request(think_constraint={"json_schema_text": '{"type": "object"}', "strict": False,
                                                      "whitespace": "JSON_WHITESPACE_COMPACT"}))
    assert (composed.think.kind, composed.think.strict, composed.think.whitespace) == ("json_schema", False, "compact")


@pytest.mark.parametrize(("reasoning", "chat_format", "message"), [
    ({"think_constraint": {"regex": "a"}}, ChatFormat(),
     "reasoning.think_constraint: this model has no think markers (the server's --think-markers START,END sets them)"),
    ({"think_constraint": {"regex": "a"}, "enabled": False}, THINKING, "reasoning.think_constraint: needs reasoning on"),
    ({"think_constraint": {"regex": "a"}, "budget_tokens": 8}, THINKING,
     "reasoning.think_constraint: cannot be combined with reasoning.budget_tokens"),
    ({"think_constraint": {"regex": ""}}, THINKING, "reasoning.think_constraint.regex: a regex constraint needs"),
    ({"think_constraint": {"json_schema_text": "{"}}, THINKING,
     "reasoning.think_constraint.json_schema_text: json_schema is not valid JSON"),
    ({"think_constraint": {"structural_tag": "{}"}}, THINKING,
     "reasoning.think_constraint.structural_tag: is not a think section's kind"),
    ({"think_constraint": {"regex": "a", "grammar_backend": "GRAMMAR_BACKEND_XGRAMMAR"}}, THINKING,
     "reasoning.think_constraint.grammar_backend: applies to the whole output"),
    ({"think_constraint": {}}, THINKING, "reasoning.think_constraint: set one of"),
])
def test_grpc_refusals_name_the_field(reasoning, chat_format, message):
    with pytest.raises(ServiceError) as info:
        planned(grpc_request(**reasoning), None, chat_format)
    assert info.value.message.startswith(message), info.value.message


@pytest.mark.parametrize(("reasoning_format", "expected"), [
    ({"regex": STEPS}, Constraint("regex", STEPS)),
    ({"type": "json_object"}, Constraint("json_object")),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "object"}, "strict": False}},
     Constraint("json_schema", '{"type": "object"}', strict=False)),
    ({"json": {"type": "array"}}, Constraint("json_schema", '{"type": "array"}')),
    ({"choice": ["a", "b"]}, Constraint("choice", choices=["a", "b"])),
    ({"grammar": 'root ::= "x"'}, Constraint("grammar", 'root ::= "x"')),
])
def test_http_reasoning_format_takes_response_format_and_structured_outputs_shapes(reasoning_format, expected):
    translated = http_request(formwork={"reasoning_format": reasoning_format}, response_format={"type": "json_object"})
    assert planned(translated.request, Constraint("json_object")).think == expected


def test_http_reasoning_format_type_text_is_free_thinking():
    translated = http_request(formwork={"reasoning_format": {"type": "text"}})
    assert translated.request.chat.think_constraint is None


@pytest.mark.parametrize(("fields", "message"), [
    ({"formwork": {"reasoning_format": {"type": "structural_tag", "format": {}}}},
     "formwork.reasoning_format.type: structural_tag is not a think section's format"),
    ({"formwork": {"reasoning_format": {"regex": "a", "choice": ["b"]}}}, "formwork.reasoning_format: set exactly one"),
    ({"formwork": {"reasoning_format": {"type": "json_schema"}}},
     "formwork.reasoning_format.json_schema.schema: is required"),
    ({"formwork": {"reasoning_format": {"regex": "a", "enable_in_reasoning": True}}},
     "formwork.reasoning_format.enable_in_reasoning: is not a think section's option"),
])
def test_http_refusals_name_the_field(fields, message):
    with pytest.raises(ServiceError) as info:
        http_request(**fields)
    assert info.value.message.startswith(message), info.value.message


def test_http_shared_checks_come_back_with_the_http_name():
    translated = http_request(formwork={"reasoning_format": {"regex": "a"}})
    with pytest.raises(ServiceError) as info:
        planned(translated.request, None, ChatFormat())
    renamed, param = translated.field_names.rename(info.value)
    assert param == "formwork.reasoning_format"
    assert renamed.message.startswith("formwork.reasoning_format: this model has no think markers (the server's "
                                      "--think-markers START,END sets them)")
    bad = http_request(formwork={"reasoning_format": {"json": "{"}})
    with pytest.raises(ServiceError) as info:
        planned(bad.request)
    renamed, param = bad.field_names.rename(info.value)
    assert param == "formwork.reasoning_format.json_schema_text"


def test_enable_in_reasoning_false_is_the_default_and_accepted():
    translated = http_request(structured_outputs={"regex": "a", "enable_in_reasoning": False})
    assert translated.request.constraint.spec == "a"


def test_responses_api_reads_reasoning_format_too():
    body = ResponsesRequest.model_validate({"input": "hi", "formwork": {"reasoning_format": {"regex": STEPS}}})
    translated = translate_response_request(body)
    assert translated.request.chat.think_constraint.spec == STEPS
    assert json.loads(json.dumps(translated.field_names.names))["reasoning.think_constraint"] == \
        "formwork.reasoning_format"


def test_a_model_without_think_markers_refuses_it_on_both_wires(make_http_server):
    server = make_http_server()
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
            "formwork": {"reasoning_format": {"regex": "[a-z]+"}}}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "formwork.reasoning_format" and "--think-markers START,END" in error["message"]
    request = json_format.ParseDict({"chat": {"messages": [{"role": "user", "content": "hi"}]}, "max_tokens": 8,
                                     "reasoning": {"think_constraint": {"regex": "[a-z]+"}}}, pb.GenerateRequest())
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.GenerationStub(channel).Generate(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("reasoning.think_constraint: this model has no think markers")


def test_enable_in_reasoning_constrains_the_whole_output_from_its_first_token():
    translated = http_request(structured_outputs={"json": {"type": "object"}, "enable_in_reasoning": True})
    assert translated.request.chat.constraint_in_reasoning
    plan = THINKING.plan(translated.request.chat, Constraint("json_schema", '{"type": "object"}'), LIMITS)
    assert plan.constraint == Constraint("json_schema", '{"type": "object"}')  # no free think section first
    assert plan.shape.reasoning == THINKING.reasoning and plan.shape.think_if_opened
    assert plan.template_kwargs == {"enable_thinking": True}  # the template renders as without it


def test_grpc_constraint_in_reasoning_is_the_same_switch():
    request = grpc_request(constraint_in_reasoning=True)
    assert request.chat.constraint_in_reasoning
    assert planned(request, Constraint("regex", "a")) == Constraint("regex", "a")


def test_enable_in_reasoning_with_tools_keeps_the_calls_from_the_first_token():
    translated = http_request(structured_outputs={"regex": "a", "enable_in_reasoning": True}, tools=[
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
    plan = THINKING.plan(translated.request.chat, Constraint("regex", "a"), LIMITS)
    assert plan.constraint.kind == "tool_calls" and not plan.constraint.think_end


@pytest.mark.parametrize(("fields", "http_field"), [
    ({"formwork": {"reasoning_budget": 8}}, "formwork.reasoning_budget"),
    ({"formwork": {"reasoning_format": {"regex": "a"}}}, "formwork.reasoning_format"),
])
def test_enable_in_reasoning_refuses_what_bounds_a_free_think_section(fields, http_field):
    translated = http_request(structured_outputs={"regex": "a", "enable_in_reasoning": True}, **fields)
    with pytest.raises(ServiceError) as info:
        planned(translated.request, Constraint("regex", "a"))
    renamed, param = translated.field_names.rename(info.value)
    assert param == http_field
    assert "cannot be combined with reasoning.constraint_in_reasoning" in renamed.message


def test_grpc_constraint_in_reasoning_needs_a_constraint():
    with pytest.raises(ServiceError) as info:
        planned(grpc_request(constraint_in_reasoning=True))
    assert info.value.message.startswith("reasoning.constraint_in_reasoning: needs an output constraint")


def test_enable_in_reasoning_on_completions_is_the_same_switch():
    from service.http.conversion import translate_completion
    from service.http.protocol import CompletionRequest
    translated = translate_completion(CompletionRequest.model_validate(
        {"prompt": "hi", "structured_outputs": {"regex": "a", "enable_in_reasoning": True}}))
    assert translated.request.chat.constraint_in_reasoning


def test_the_python_client_sets_constraint_in_reasoning():
    from formwork_client.request import generate_request
    request = generate_request(messages=[{"role": "user", "content": "hi"}], constraint={"type": "object"},
                               constraint_in_reasoning=True)
    assert chat_options_from_proto(request).constraint_in_reasoning
    assert not chat_options_from_proto(generate_request(prompt="hi")).constraint_in_reasoning
