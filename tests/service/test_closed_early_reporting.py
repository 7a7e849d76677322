"""`close_early` in, `closed_early` out: the switch and the report through every API (no model)."""
from __future__ import annotations

import pytest
from test_http_conversion import chat
from test_service_conversion import constraint_of, final_output

from engine.frontend.output_processor import OutputProcessor
from engine.frontend.tokenizer import Tokenizer
from engine.protocol import EngineCoreOutput, FinishReason
from engine.sampling_params import SamplingParams
from grammar.constraint import Constraint
from service.errors import ServiceError
from service.grpc import responses
from service.http.conversion import translate_chat
from service.http.responses import formwork_extension


@pytest.fixture(scope="module")
def tok(model_dir) -> Tokenizer:
    return Tokenizer.from_model_dir(model_dir)


def test_the_switch_travels_from_grpc_and_http():
    assert constraint_of(json_object={}, close_early=False) == Constraint(kind="json_object", close_early=False)
    assert constraint_of(json_object={}).close_early is None  # unset: the engine's default
    options = translate_chat(chat(guided_json={"type": "object"}, formwork={"close_early": False}))
    assert options.request.constraint.close_early is False
    with pytest.raises(ServiceError) as info:
        translate_chat(chat(formwork={"close_early": True}))
    assert info.value.message == "formwork: close_early needs an output constraint"


def test_the_report_reaches_the_offline_output(tok):
    processor = OutputProcessor(tok)
    processor.add_request("r", [1, 2], SamplingParams(max_tokens=8), stream=False)
    outputs, _ = processor.process_outputs([EngineCoreOutput(
        "r", [5, 6], finish_reason=int(FinishReason.STOP), closed_early="repetition")])
    assert outputs[0].finish_reason == FinishReason.STOP and outputs[0].closed_early == "repetition"


def test_the_report_reaches_grpc_and_http():
    closed = final_output(closed_early="budget")
    assert responses.generate_response(closed, "c", str, delta=False).closed_early == "budget"
    assert responses.generate_response(final_output(), "c", str, delta=False).closed_early == ""
    assert formwork_extension([closed])["choices"][0]["closed_early"] == "budget"
    assert "closed_early" not in formwork_extension([final_output()])["choices"][0]
