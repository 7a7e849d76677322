"""The switches and counters of speculative decoding at the edges: the server flags, the request's
switch over gRPC, the drafted and accepted counts in the engine's final output, the gRPC usage and
the HTTP extension. No model (the tokenizer only)."""
from __future__ import annotations

import argparse
from dataclasses import replace

import pytest
from google.protobuf import json_format

from engine.args import add_engine_args, engine_config_from_args
from engine.frontend.output_processor import OutputProcessor, RequestOutput
from engine.frontend.tokenizer import Tokenizer
from engine.protocol import EngineCoreOutput, FinishReason, RequestCounters
from engine.sampling_params import SamplingParams
from service._gen.formwork.v1 import generation_pb2 as pb
from service.grpc import responses
from service.grpc.requests import generation_request_from_proto
from service.http.responses import formwork_extension
from service.limits import ServiceLimits
from service.validation import sampling_params


def engine_config(*argv):
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    return engine_config_from_args(parser.parse_args(list(argv)))


def test_server_flags():
    default = engine_config()  # on for CPU, off on CUDA (unmeasured there), unless a flag says
    assert default.speculative.enabled is None and default.resolved_speculative.enabled
    assert not replace(default, device="cuda").resolved_speculative.enabled
    assert replace(engine_config("--speculative-ngram"), device="cuda").resolved_speculative.enabled
    config = engine_config("--speculative-ngram", "--num-speculative-tokens", "5").speculative
    assert config.enabled and config.num_speculative_tokens == 5
    assert not engine_config("--no-speculative-ngram").speculative.enabled
    assert engine_config().speculative.draft_by_text and not engine_config("--no-draft-by-text").speculative.draft_by_text


def test_the_request_switch_over_grpc():
    limits = ServiceLimits(max_tokens_cap=512, default_max_tokens=64, max_constraint_bytes=1000)
    for fields, expected in (({}, None), ({"speculative": True}, True), ({"speculative": False}, False)):
        request = json_format.ParseDict({"prompt": "hi", **fields}, pb.GenerateRequest())
        assert sampling_params(generation_request_from_proto(request), limits, 49152).speculative is expected


@pytest.fixture(scope="module")
def tok(model_dir) -> Tokenizer:
    return Tokenizer.from_model_dir(model_dir)


def final_output(**fields) -> RequestOutput:
    values = dict(request_id="r", text="abc", delta_text="", token_ids=[5, 6, 7], new_token_ids=[],
                  finished=True, finish_reason=FinishReason.STOP, num_output_tokens=3)
    return RequestOutput(**{**values, **fields})


def test_counts_reach_the_grpc_usage_and_the_http_extension():
    drafted = final_output(counters=RequestCounters(num_draft_tokens=12, num_accepted_draft_tokens=9))
    usage = responses.generate_response(drafted, "r", str, delta=False).usage
    assert (usage.draft_tokens, usage.accepted_draft_tokens) == (12, 9)
    entry = formwork_extension([drafted])["choices"][0]
    assert (entry["draft_tokens"], entry["accepted_draft_tokens"]) == (12, 9)
    assert "draft_tokens" not in formwork_extension([final_output()])["choices"][0]  # only when it drafted


def test_the_front_end_keeps_the_engines_counts(tok):
    processor = OutputProcessor(tok)
    processor.add_request("r", [1, 2, 3], SamplingParams(max_tokens=8), stream=False)
    outputs, _ = processor.process_outputs([EngineCoreOutput(
        "r", [5, 6, 7], finish_reason=int(FinishReason.LENGTH),
        counters=RequestCounters(num_draft_tokens=4, num_accepted_draft_tokens=3))])
    assert (outputs[0].counters.num_draft_tokens, outputs[0].counters.num_accepted_draft_tokens) == (4, 3)


def test_a_request_ended_on_a_stop_string_keeps_the_draft_counts_of_its_last_step(tok):
    processor = OutputProcessor(tok)
    processor.add_request("r", [1, 2, 3], SamplingParams(max_tokens=32, stop=["END"]), stream=False)
    processor.process_outputs([EngineCoreOutput(
        "r", tok.encode("The answer is"), counters=RequestCounters(num_draft_tokens=3, num_accepted_draft_tokens=2))])
    outputs, to_abort = processor.process_outputs([EngineCoreOutput(
        "r", tok.encode(" 42 END and more"),
        counters=RequestCounters(num_draft_tokens=7, num_accepted_draft_tokens=5))])
    assert to_abort == ["r"]  # the engine's final output never comes
    assert outputs[0].stop_reason == "END"
    assert (outputs[0].counters.num_draft_tokens, outputs[0].counters.num_accepted_draft_tokens) == (7, 5)
