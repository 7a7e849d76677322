"""Responses API requests -> the service's wire-neutral GenerationRequest
(service/http/response_request.py), and the refusals, named as the request names its fields."""
from __future__ import annotations

import json

import pytest

from service.errors import ServiceError
from service.http.response_request import ResponsesRequest, translate_response_request
from service.limits import ServiceLimits
from service.validation import sampling_params

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def translate(**fields):
    return translate_response_request(ResponsesRequest.model_validate({"input": "hi", **fields}))


def messages_of(**fields) -> list[dict]:
    return translate(**fields).request.prompts[0].messages


def test_a_string_input_with_instructions():
    assert messages_of(input="hello", instructions="be brief") == [{"role": "system", "content": "be brief"},
                                                                   {"role": "user", "content": "hello"}]


def test_input_items_become_chat_messages():
    items = [{"role": "developer", "content": "rules"},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                              {"type": "input_text", "text": "b"}]},
             {"type": "reasoning", "id": "rs_1", "summary": []},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}'},
             {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": "42"}]
    system, user, assistant, tool = messages_of(input=items)
    assert system == {"role": "system", "content": "rules"} and user == {"role": "user", "content": "ab"}
    assert [c["id"] for c in assistant["tool_calls"]] == ["c1", "c2"]  # consecutive calls: one assistant turn
    assert assistant["tool_calls"][0]["function"] == {"name": "f", "arguments": {"x": 1}}
    assert tool == {"role": "tool", "content": "42", "tool_call_id": "c1"}


def test_sampling_format_and_tools():
    translated = translate(max_output_tokens=9, temperature=0, top_p=0.5,
                           text={"format": {"type": "json_schema", "name": "x", "schema": SCHEMA, "strict": False}},
                           tools=[{"type": "function", "name": "f", "parameters": SCHEMA, "strict": True}],
                           tool_choice={"type": "function", "name": "f"}, parallel_tool_calls=False,
                           formwork={"reasoning_budget": 4, "whitespace": "compact"})
    request = translated.request
    assert (request.sampling.max_tokens, request.sampling.temperature, request.sampling.top_p) == (9, 0, 0.5)
    assert json.loads(request.constraint.spec) == SCHEMA and request.constraint.strict is False
    assert request.constraint.whitespace == "compact"
    assert request.chat.tool_choice == "named" and request.chat.tool_name == "f"
    assert not request.chat.parallel_tool_calls and request.chat.reasoning_budget == 4
    assert translate(text={"format": {"type": "json_object"}}).request.constraint.kind == "json_object"
    assert translate(text={"format": {"type": "text"}}, store=True, user="u", metadata={}).request.constraint is None


def test_range_errors_name_the_field_as_the_request_names_it():
    translated = translate(text={"format": {"type": "json_schema", "name": "x", "schema": SCHEMA}},
                           max_output_tokens=99999)
    with pytest.raises(ServiceError) as info:
        sampling_params(translated.request, ServiceLimits(), 1000)
    renamed, param = translated.field_names.rename(info.value)
    assert param == "max_output_tokens" and renamed.message.startswith("max_output_tokens: 99999 exceeds")


@pytest.mark.parametrize("fields, message", [
    ({"previous_response_id": "resp_1"}, "previous_response_id: this server stores no responses"),
    ({"conversation": "conv_1"}, "conversation: this server stores no conversations"),
    ({"background": True}, "background: background responses are not supported"),
    ({"include": ["reasoning.encrypted_content"]}, "include[0]: 'reasoning.encrypted_content' is not supported"),
    ({"truncation": "auto"}, "truncation: only disabled"),
    ({"reasoning": {"summary": "auto"}}, "reasoning.summary: is not supported"),
    ({"text": {"verbosity": "low"}}, "text.verbosity: is not supported"),
    ({"max_tool_calls": 2}, "max_tool_calls: is not supported"),
    ({"tools": [{"type": "file_search", "vector_store_ids": []}]}, "tools[0].type: only function tools"),
    ({"tools": [{"type": "function", "name": "f", "cache": True}]}, "tools[0].cache: is not supported"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type: 'item_reference' is not supported"),
    ({"input": [{"role": "critic", "content": "x"}]}, "input[0].role: must be user, assistant, system or developer"),
    ({"input": []}, "input: must hold at least one message"),
    ({"max_output_tokens": 0}, "max_output_tokens: must be >= 1, got 0"),
    ({"formwork": {"strict": True}}, "formwork: needs an output constraint (text.format) for strict"),
    ({"guided_json": SCHEMA}, "guided_json: is not an output constraint Formwork reads here; constrain the output "
                              "with text.format"),
    ({"seed": 1}, "seed: is not supported by this server"),
])
def test_refusals_name_the_field(fields, message):
    with pytest.raises(ServiceError) as info:
        translate(**fields)
    assert info.value.message.startswith(message)
