"""The real model (SmolLM2, given the think markers <think>,</think> as the server's --think-markers
gives them) thinking under its own constraint: the reasoning it writes matches the think regex, and
the answer after the end marker validates against the request's schema, on both backends."""
from __future__ import annotations

import json
import re

import jsonschema
import msgspec
import pytest
from google.protobuf import json_format

from engine.sampling_params import SamplingParams
from grammar.chat.reasoning import ReasoningMarkers, split_reasoning
from grammar.constraint import Constraint
from service._gen.formwork.v1 import generation_pb2 as pb
from service.chat_format import ChatFormat
from service.grpc.requests import chat_options_from_proto
from service.limits import ServiceLimits
from service.request import GenerationRequest
from service.validation import think_constraint

MARKERS = ReasoningMarkers("<think>", "</think>")
STEPS = r"(Step [1-3]: [a-z ]{1,24}\n){1,3}"
FORECAST = {"type": "object", "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                                             "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["unit", "days"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Plan the weather forecast for Lisbon in steps, then answer in JSON."}]


def planned_constraint(backend: str) -> Constraint:
    """The constraint the service builds for a request with think_constraint and this answer schema."""
    limits = ServiceLimits(think_start=MARKERS.start, think_end=MARKERS.end)
    request = json_format.ParseDict({"chat": {"messages": ASK}, "reasoning": {"think_constraint": {"regex": STEPS}}},
                                    pb.GenerateRequest())
    generation = GenerationRequest((), chat=chat_options_from_proto(request))
    answer = Constraint("json_schema", json.dumps(FORECAST), grammar_backend=backend)
    plan = ChatFormat(reasoning=MARKERS).plan(generation.chat, answer, limits, think_constraint(generation, limits))
    assert plan.constraint is not None and plan.constraint.think is not None
    return plan.constraint


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_reasoning_matches_its_regex_and_the_answer_validates(llm, backend):
    constraint = planned_constraint(backend)
    params = SamplingParams(max_tokens=200, temperature=0, constraint=constraint)
    [output] = llm.generate([{"prompt_token_ids": llm.tokenizer.encode_chat(ASK)}], params)
    reasoning, answer, ended = split_reasoning(output.text, MARKERS)
    assert ended, output.text
    assert re.fullmatch(STEPS, reasoning), reasoning
    jsonschema.validate(json.loads(answer), FORECAST)


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_an_unbounded_think_constraint_is_closed_before_max_tokens(llm, backend):
    """The model rambles inside the think regex; closing early finishes the reasoning in its
    shape, writes the end marker and a valid answer within max_tokens."""
    sentence = r"([a-z]+ )+[a-z]+\."
    constraint = msgspec.structs.replace(planned_constraint(backend), think=Constraint("regex", sentence))
    params = SamplingParams(max_tokens=60, temperature=0, constraint=constraint)
    [output] = llm.generate([{"prompt_token_ids": llm.tokenizer.encode_chat(ASK)}], params)
    reasoning, answer, ended = split_reasoning(output.text, MARKERS)
    assert ended and output.num_output_tokens <= 60, output.text
    assert re.fullmatch(sentence, reasoning), reasoning
    jsonschema.validate(json.loads(answer), FORECAST)


def test_a_think_constraint_the_model_cannot_meet_is_refused_at_compile(llm):
    bad = msgspec.structs.replace(planned_constraint("xgrammar"), think=Constraint("regex", "(unclosed"))
    [output] = llm.generate([{"prompt_token_ids": llm.tokenizer.encode_chat(ASK)}],
                            SamplingParams(max_tokens=8, constraint=bad))
    assert output.error and "regex" in output.error, output
