"""The Generation API on loopback with the real model (the shared `default_server`, small max_tokens)."""
from __future__ import annotations

import json
import re

import grpc
import jsonschema
import pytest
from google.protobuf import json_format

from live_server import PERSON_SCHEMA, chat, error_of, field_violations
from service._gen.formwork.v1 import generation_pb2 as pb

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(default_server):
    return default_server


# ---- generation -------------------------------------------------------------------------------


def test_unary_greedy_answer(server):
    response = server.stub.Generate(chat("What is the capital of France?", max_tokens=12, temperature=0), timeout=60)
    assert "Paris" in response.text
    assert response.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH)
    assert response.usage.completion_tokens == len(response.token_ids) > 0
    assert response.usage.prompt_tokens > 10  # the chat template's system prompt and headers
    timings = response.timings
    assert 0 < timings.time_to_first_token_s <= timings.total_s
    assert timings.forward_passes >= 1


def test_stream_deltas_add_up_to_the_unary_answer(server):
    request = chat("Name three colors.", max_tokens=16, temperature=0)
    unary = server.stub.Generate(request, timeout=60)
    messages = list(server.stub.GenerateStream(request, timeout=60))
    assert len(messages) > 1
    assert all(m.finish_reason == pb.FINISH_REASON_UNSPECIFIED and not m.HasField("usage") for m in messages[:-1])
    last = messages[-1]
    assert last.finish_reason == unary.finish_reason and last.HasField("usage") and last.HasField("timings")
    assert "".join(m.text for m in messages) == unary.text
    assert [t for m in messages for t in m.token_ids] == list(unary.token_ids)
    assert last.usage.completion_tokens == len(unary.token_ids)


def test_inline_json_schema_output_is_valid(server):
    request = chat("Invent a person. Answer in JSON.", max_tokens=48, temperature=0,
                   constraint={"json_schema": PERSON_SCHEMA})
    response = server.stub.Generate(request, timeout=60)
    assert response.finish_reason == pb.FINISH_REASON_STOP
    jsonschema.validate(json.loads(response.text), PERSON_SCHEMA)


@pytest.mark.parametrize("constraint, check", [
    ({"regex": r"[A-Z][a-z]{2,8}, [A-Z][a-z]{2,8}"}, lambda t: re.fullmatch(r"[A-Z][a-z]{2,8}, [A-Z][a-z]{2,8}", t)),
    ({"choice": {"choices": ["yes", "no"]}}, lambda t: t in ("yes", "no")),
    ({"grammar": 'root ::= "answer: " ("red" | "green" | "blue")'},
     lambda t: t in ("answer: red", "answer: green", "answer: blue")),
    ({"json_object": {}}, lambda t: isinstance(json.loads(t), dict)),
], ids=["regex", "choice", "grammar", "json_object"])
def test_constrained_outputs_match(server, constraint, check):
    response = server.stub.Generate(chat("Answer briefly: is the sky blue?", max_tokens=24, temperature=0,
                                         constraint=constraint), timeout=60)
    assert response.finish_reason == pb.FINISH_REASON_STOP, response
    assert check(response.text), response.text


def test_stop_string_and_logprobs(server):
    response = server.stub.Generate(chat("Count: one, two, three, four, five", max_tokens=24, temperature=0,
                                         stop=["\n"], logprobs=2), timeout=60)
    assert response.finish_reason == pb.FINISH_REASON_STOP
    assert response.stop_string == "\n" and response.text and "\n" not in response.text
    assert len(response.logprobs) == len(response.token_ids)
    for token_id, logprob in zip(response.token_ids, response.logprobs):
        assert logprob.token_id == token_id and logprob.logprob <= 0 and len(logprob.top) == 2
        assert logprob.top[0].logprob >= logprob.top[1].logprob


def test_validate_constraint_compiles_then_is_cached(server):
    constraint = json_format.ParseDict(
        {"json_schema": {"type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}}}},
        pb.Constraint())
    first = server.stub.ValidateConstraint(pb.ValidateConstraintRequest(constraint=constraint), timeout=30)
    second = server.stub.ValidateConstraint(pb.ValidateConstraintRequest(constraint=constraint), timeout=30)
    assert first.ok and second.ok and second.cached
    bad = server.stub.ValidateConstraint(pb.ValidateConstraintRequest(constraint=pb.Constraint(regex="(ab")), timeout=30)
    assert not bad.ok and "parenthesis" in bad.error


def test_tokenize_matches_generate_prompt(server):
    tokenized = server.stub.Tokenize(pb.TokenizeRequest(chat=chat("Hi").chat), timeout=10)
    response = server.stub.Generate(chat("Hi", max_tokens=1), timeout=60)
    assert len(tokenized.token_ids) == response.usage.prompt_tokens
    assert tokenized.rendered_prompt.endswith("<|im_start|>assistant\n")


# ---- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("constraint, field, words", [
    ({"json_schema": {"type": "nonsense"}}, "constraint.json_schema", "nonsense"),
    ({"json_schema_text": '{"type": "object", '}, "constraint.json_schema_text", "not valid JSON"),
    ({"regex": "(ab"}, "constraint.regex", "parenthesis"),
    ({"grammar": "root ::= undefined_rule"}, "constraint.grammar", "undefined_rule"),
], ids=["schema", "schema-text", "regex", "grammar"])
def test_bad_constraint_is_invalid_argument_naming_the_field(server, constraint, field, words):
    for call in (server.stub.Generate, server.stub.GenerateStream):
        error = error_of(call, chat("x", max_tokens=4, constraint=constraint), timeout=30)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert words in error.details() and field in field_violations(error), error.details()


@pytest.mark.parametrize("fields, field", [
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 100000}, "max_tokens"),
    ({"stop_token_ids": [10**6]}, "stop_token_ids"),
    ({"logprobs": 50}, "logprobs"),
    ({"stop": [""]}, "stop"),
    ({"constraint": {"choice": {}}}, "constraint.choice"),
    ({"constraint": {}}, "constraint"),
])
def test_bad_parameter_is_invalid_argument_naming_the_field(server, fields, field):
    error = error_of(server.stub.Generate, chat("x", **fields), timeout=10)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert list(field_violations(error)) == [field], error.details()


@pytest.mark.parametrize("request_fields, field", [
    ({}, "input"), ({"prompt": ""}, "prompt"), ({"prompt_token_ids": {"ids": [10**6]}}, "prompt_token_ids.ids"),
    ({"chat": {"messages": []}}, "chat.messages"), ({"chat": {"messages": [{"content": "x"}]}}, "chat.messages[0].role"),
])
def test_bad_input_is_invalid_argument(server, request_fields, field):
    error = error_of(server.stub.Generate, json_format.ParseDict(request_fields, pb.GenerateRequest()), timeout=10)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in field_violations(error), error.details()


def test_prompt_longer_than_the_context_is_invalid_argument_with_the_numbers(server):
    error = error_of(server.stub.Generate, pb.GenerateRequest(prompt="hello " * 600, max_tokens=4), timeout=10)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert re.search(r"the prompt has \d{3} tokens; the context length is 512", error.details()), error.details()


# ---- cancellation, deadlines and the queue ----------------------------------------------------


def test_client_cancel_aborts_the_running_request_and_frees_its_kv_blocks(server):
    call = server.stub.GenerateStream(chat("Write a long story about a dragon.", max_tokens=200), timeout=60)
    next(call)
    next(call)
    running = server.model_info().load
    assert running.num_running == 1 and running.num_free_kv_blocks < running.num_total_kv_blocks
    call.cancel()
    load = server.wait_idle()
    assert load.num_running == 0 and load.num_free_kv_blocks == load.num_total_kv_blocks, load


def test_deadline_aborts_the_request_and_frees_its_kv_blocks(server):
    error = error_of(server.stub.Generate, chat("Write a long story about a dragon.", max_tokens=200), timeout=1.0)
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    load = server.wait_idle()
    assert load.num_running == 0 and load.num_free_kv_blocks == load.num_total_kv_blocks, load
