"""OpenAI's Responses API (`/v1/responses`) with the openai SDK's `responses.create`, `.parse` and
`.stream` against a live server on the real model; reasoning items on a server given think markers."""
from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from live_server import PERSON_SCHEMA, LiveServer

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                               "required": ["city"], "additionalProperties": False}}


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)


@pytest.fixture(scope="module")
def client(default_server):
    with openai.OpenAI(base_url=f"{default_server.http_url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def test_create_with_instructions_and_a_json_schema(client):
    response = client.responses.create(
        model=MODEL, instructions="Answer in JSON.", input="Invent a person.", max_output_tokens=48, temperature=0,
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON_SCHEMA, "strict": True}})
    assert response.status == "completed" and response.object == "response" and response.id.startswith("resp_")
    [message] = response.output
    assert message.type == "message" and message.role == "assistant"
    jsonschema.validate(json.loads(response.output_text), PERSON_SCHEMA)
    usage = response.usage
    assert usage.input_tokens > 5 and 0 < usage.output_tokens <= 48
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert response.instructions == "Answer in JSON." and response.store is False


def test_parse_with_a_pydantic_model_and_a_message_list(client):
    response = client.responses.parse(
        model=MODEL, input=[{"role": "system", "content": "You invent people."},
                            {"role": "user", "content": [{"type": "input_text", "text": "Invent a person."}]}],
        text_format=Person, max_output_tokens=48, temperature=0)
    person = response.output_parsed
    assert isinstance(person, Person) and 0 <= person.age <= 120


def test_json_object_and_max_output_tokens(client):
    response = client.responses.create(model=MODEL, input="Describe a cat in JSON.", max_output_tokens=40,
                                       temperature=0, text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(response.output_text), dict)
    cut = client.responses.create(model=MODEL, input="Tell me a long story.", max_output_tokens=3)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 3


def test_stream_events_add_up_to_the_whole_response(client):
    fields = dict(model=MODEL, input="Invent a person.", max_output_tokens=48, temperature=0, text_format=Person)
    with client.responses.stream(**fields) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.output_text and isinstance(final.output_parsed, Person)
    assert final.output_text == client.responses.parse(**fields).output_text  # greedy: the same answer
    done = [e for e in events if e.type == "response.output_text.done"]
    assert len(done) == 1 and done[0].text == text


def test_function_calls_whole_streamed_and_sent_back(client):
    fields = dict(model=MODEL, input="What is the weather in Paris?", tools=[WEATHER_TOOL], tool_choice="required",
                  parallel_tool_calls=False, max_output_tokens=48, temperature=0)
    response = client.responses.create(**fields)
    [call] = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER_TOOL["parameters"])
    with client.responses.stream(**fields) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    [streamed] = [item for item in final.output if item.type == "function_call"]
    assert deltas == streamed.arguments == call.arguments
    answer = client.responses.create(
        model=MODEL, tools=[WEATHER_TOOL], tool_choice="none", max_output_tokens=16, temperature=0,
        input=[{"role": "user", "content": "What is the weather in Paris?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature_c": 21}'}])
    assert answer.status in ("completed", "incomplete") and answer.output[0].type == "message"


@pytest.mark.parametrize("fields, param, message", [
    ({"previous_response_id": "resp_1"}, "previous_response_id", "previous_response_id: this server stores no "
                                                                  "responses"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "tools[0].type: only function tools are supported"),
    ({"reasoning": {"effort": "low"}}, "reasoning.effort", "reasoning.effort: is not supported"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0]", "input[0].content[0]: only text parts are supported"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object", "properties": {
        "a": {"$dynamicRef": "#a"}}}}}}, "text.format.schema", 'text.format.schema: unsupported keyword "$dynamicRef"'),
    ({"regex": "b"}, "regex", "regex: is not an output constraint Formwork reads here; constrain the output with "
                              "text.format"),
    ({"frobnicate": 1}, "frobnicate", "frobnicate: is not supported by this server"),
])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_refusals_name_the_field(client, fields, param, message, stream):
    fields = {"model": MODEL, "input": "hi", "max_output_tokens": 4, **fields}
    known = {k: fields.pop(k) for k in list(fields) if k in ("model", "input", "max_output_tokens", "tools",
                                                              "reasoning", "text", "previous_response_id")}
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(**known, stream=stream, extra_body=fields)
    assert info.value.body["message"].startswith(message) and info.value.body["param"] == param


@pytest.fixture(scope="module")
def thinking_client():
    server = LiveServer("--think-markers", "<think>,</think>", startup_timeout_s=900)
    with openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c
    assert server.stop() == 0, server.log()


def test_reasoning_items_for_a_model_with_think_markers(thinking_client):
    fields = dict(model=MODEL, input="Invent a person.", max_output_tokens=64, temperature=0, text_format=Person,
                  extra_body={"formwork": {"reasoning_budget": 5}})
    response = thinking_client.responses.parse(**fields)
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text
    assert message.type == "message" and isinstance(response.output_parsed, Person)
    assert 0 < response.usage.output_tokens_details.reasoning_tokens < response.usage.output_tokens
    with thinking_client.responses.stream(**fields) as stream:
        events = list(stream)
        final = stream.get_final_response()
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert thought == final.output[0].content[0].text == reasoning.content[0].text
    assert final.output_text == response.output_text


THINK_STEPS = r"(Step [1-3]: [a-z ]{1,24}\n){1,3}"


def test_reasoning_format_constrains_the_think_text_on_chat_and_responses(thinking_client):
    """formwork.reasoning_format: the reasoning the server sends back matches its regex, and the
    answer still has response_format's shape."""
    think = {"formwork": {"reasoning_format": {"regex": THINK_STEPS}}}
    chat = thinking_client.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Invent a person."}], max_tokens=160, temperature=0,
        response_format=Person, extra_body=think)
    message = chat.choices[0].message
    assert re.fullmatch(THINK_STEPS, message.reasoning_content), message.reasoning_content
    assert isinstance(message.parsed, Person)
    response = thinking_client.responses.parse(model=MODEL, input="Invent a person.", max_output_tokens=160,
                                               temperature=0, text_format=Person, extra_body=think)
    reasoning, _ = response.output
    assert re.fullmatch(THINK_STEPS, reasoning.content[0].text) and isinstance(response.output_parsed, Person)


def test_enable_in_reasoning_constrains_the_whole_output_and_reads_back_coherently(thinking_client):
    """structured_outputs.enable_in_reasoning: the constraint holds from the first token. A JSON
    schema leaves no think section (all of it is content, no reasoning_content); a regex that writes
    the markers itself gives the reasoning between them and the answer after, whole and streamed."""
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "Invent a person."}], max_tokens=160, temperature=0)
    json_only = thinking_client.chat.completions.create(
        **ask, extra_body={"structured_outputs": {"json": Person.model_json_schema(), "enable_in_reasoning": True}})
    message = json_only.choices[0].message
    assert not message.reasoning_content, message  # no think section written: empty
    Person.model_validate_json(message.content)
    steps_then_answer = "<think>\n" + THINK_STEPS + "</think>\n\n(yes|no)"
    extra = {"structured_outputs": {"regex": steps_then_answer, "enable_in_reasoning": True}}
    whole = thinking_client.chat.completions.create(**ask, extra_body=extra).choices[0].message
    assert re.fullmatch(THINK_STEPS, whole.reasoning_content), whole.reasoning_content
    assert whole.content in ("yes", "no")
    chunks = list(thinking_client.chat.completions.create(**ask, extra_body=extra, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == whole.reasoning_content
    assert "".join(d.content or "" for d in deltas) == whole.content
