"""formwork.v1 <-> the service's requests and the engine's structs, errors, generated stubs and import
hygiene (no server, no model)."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import json_format
from google.rpc import error_details_pb2

from engine.frontend.output_processor import RequestOutput, RequestTimings
from engine.protocol import (ConstraintReport, EngineCoreReady, EngineStats, ErrorKind, FinishReason, RequestCounters,
                             TokenLogprob)
from engine.sampling_params import SamplingParams
from grammar.constraint import Constraint
from service import protogen
from service._gen.formwork.v1 import generation_pb2 as pb
from service.errors import ErrorCode, ServiceError, error_from_output
from service.grpc import responses
from service.grpc.requests import constraint_from_proto, generation_request_from_proto, prompt_from_proto
from service.grpc.status import status_proto
from service.limits import ServiceLimits
from service.request import PromptInput
from service.validation import check_prompt, engine_constraint, sampling_params

REPO_ROOT = Path(__file__).resolve().parents[2]
LIMITS = ServiceLimits(max_tokens_cap=512, default_max_tokens=64, max_constraint_bytes=1000)
VOCAB = 49152


def request(**fields) -> pb.GenerateRequest:
    return json_format.ParseDict({"prompt": "hi", **fields}, pb.GenerateRequest())


def params_of(**fields) -> SamplingParams:
    return sampling_params(generation_request_from_proto(request(**fields)), LIMITS, VOCAB)


def violation(**fields) -> tuple[str, str]:
    with pytest.raises(ServiceError) as info:
        params_of(**fields)
    error = info.value
    assert error.code == ErrorCode.INVALID_ARGUMENT and len(error.violations) == 1
    return error.violations[0].field, error.message


# ---- sampling parameters ----------------------------------------------------------------------


def test_unset_fields_take_the_engine_defaults_and_the_server_max_tokens():
    assert params_of() == SamplingParams(max_tokens=LIMITS.default_max_tokens)


@pytest.mark.parametrize("name, value", [
    ("temperature", 0.0), ("temperature", 0.5), ("top_p", 0.9), ("top_k", 5), ("min_p", 0.1), ("seed", -3),
    ("seed", 7), ("repetition_penalty", 1.2), ("frequency_penalty", -0.5), ("presence_penalty", 0.5),
    ("ignore_eos", True), ("include_stop_str_in_output", True), ("logprobs", 0), ("logprobs", 3), ("min_tokens", 5),
])
def test_each_optional_field_set_alone_overrides_only_itself(name, value):
    expected = SamplingParams(max_tokens=LIMITS.default_max_tokens, **{name: value})
    assert params_of(**{name: value}) == expected


def test_temperature_zero_is_greedy_and_unset_is_not():
    assert params_of(temperature=0).greedy
    assert not params_of().greedy


def test_repeated_fields_and_max_tokens():
    params = params_of(stop=["\n", "END"], stop_token_ids=[2, 7], max_tokens=512)
    assert params.stop == ["\n", "END"] and params.stop_token_ids == [2, 7] and params.max_tokens == 512


@pytest.mark.parametrize("fields, field, words", [
    ({"temperature": -1}, "temperature", "must be >= 0"),
    ({"temperature": "NaN"}, "temperature", "finite"),
    ({"top_p": 0}, "top_p", "(0, 1]"),
    ({"top_p": "Infinity"}, "top_p", "finite"),
    ({"min_p": 2}, "min_p", "[0, 1]"),
    ({"repetition_penalty": 0}, "repetition_penalty", "> 0"),
    ({"frequency_penalty": 3}, "frequency_penalty", "[-2, 2]"),
    ({"logprobs": 21}, "logprobs", "[0, 20]"),
    ({"max_tokens": 0}, "max_tokens", ">= 1"),
    ({"min_tokens": 65}, "min_tokens", "[0, max_tokens (64)]"),
    ({"max_tokens": 513}, "max_tokens", "max_tokens_cap of 512"),
    ({"stop": ["ok", ""]}, "stop", "non-empty"),
    ({"stop_token_ids": [VOCAB]}, "stop_token_ids", f"[0, {VOCAB})"),
])
def test_bad_parameters_name_their_field(fields, field, words):
    got_field, message = violation(**fields)
    assert got_field == field and message.startswith(f"{field}: ") and words in message


# ---- constraints ------------------------------------------------------------------------------


def constraint_of(**fields) -> Constraint:
    return engine_constraint(constraint_from_proto(json_format.ParseDict(fields, pb.Constraint())), LIMITS)


def test_constraint_defaults_are_the_engines():
    assert constraint_of(json_object={}) == Constraint(kind="json_object")
    assert constraint_of(regex="a+", strict=False, any_whitespace=True, jump_forward=False) == Constraint(
        kind="regex", spec="a+", strict=False, any_whitespace=True, jump_forward=False)


def test_inline_schema_keeps_integers_and_sorts_keys():
    schema = {"type": "object", "required": ["b"], "properties": {"b": {"type": "integer", "minimum": 1,
              "maximum": 2.5, "enum": [1, 2, None, True, "x"]}, "a": {"type": "array", "items": {}}}}
    constraint = constraint_of(json_schema=schema)
    assert constraint.kind == "json_schema"
    assert constraint.spec == json.dumps(schema, sort_keys=True)
    assert json.loads(constraint.spec)["properties"]["b"]["minimum"] == 1
    assert '"minimum": 1,' in constraint.spec and '"maximum": 2.5' in constraint.spec


def test_schema_text_is_kept_as_written():
    text = '{"type": "object", "properties": {"z": {"const": 1.0}, "a": {"type": "string"}}}'
    assert constraint_of(json_schema_text=text) == Constraint(kind="json_schema", spec=text)


def test_choice_and_grammar():
    assert constraint_of(choice={"choices": ["yes", "no"]}) == Constraint(kind="choice", choices=["yes", "no"])
    assert constraint_of(grammar='root ::= "a"') == Constraint(kind="grammar", spec='root ::= "a"')
    assert constraint_of(grammar='start: "a"', grammar_syntax=pb.GRAMMAR_SYNTAX_LARK) == Constraint(
        kind="grammar", spec='start: "a"', grammar_syntax="lark")


@pytest.mark.parametrize("fields, field, words", [
    ({}, "constraint", "set one of"),
    ({"json_schema_text": "{not json"}, "constraint.json_schema_text", "not valid JSON"),
    ({"json_schema_text": "[1]"}, "constraint.json_schema_text", "JSON object"),
    ({"regex": ""}, "constraint.regex", "non-empty spec"),
    ({"choice": {}}, "constraint.choice", "at least one choice"),
    ({"choice": {"choices": ["a", ""]}}, "constraint.choice", "non-empty"),
    ({"regex": "a" * 1001}, "constraint.regex", "1001 bytes; this server's max_constraint_bytes is 1000"),
    ({"json_schema": {"description": "x" * 1000}}, "constraint.json_schema", "max_constraint_bytes is 1000"),
    ({"regex": "a", "grammar_syntax": pb.GRAMMAR_SYNTAX_LARK}, "constraint.grammar_syntax", "not regex"),
    ({"grammar": "root ::= \"a\"", "grammar_syntax": 7}, "constraint.grammar_syntax", "unknown value 7"),
])
def test_bad_constraints_name_their_field(fields, field, words):
    with pytest.raises(ServiceError) as info:
        constraint_of(**fields)
    assert [v.field for v in info.value.violations] == [field] and words in info.value.message


def test_constraint_field_of_a_request():
    assert generation_request_from_proto(request(constraint={"regex": "a"})).constraint_field == "constraint.regex"
    assert generation_request_from_proto(request()).constraint_field is None


# ---- prompts ----------------------------------------------------------------------------------


def prompt_of(request: pb.GenerateRequest) -> PromptInput:
    return check_prompt(prompt_from_proto(request), VOCAB)


def test_prompts():
    assert prompt_of(request()) == PromptInput(field="prompt", text="hi")
    chat = json_format.ParseDict({"chat": {"messages": [{"role": "user", "content": ""}],
                                           "add_generation_prompt": False}}, pb.GenerateRequest())
    assert prompt_of(chat) == PromptInput(
        field="chat", messages=[{"role": "user", "content": ""}], add_generation_prompt=False)
    ids = pb.GenerateRequest(prompt_token_ids=pb.TokenIds(ids=[1, 2]))
    assert prompt_of(ids).token_ids == [1, 2]


@pytest.mark.parametrize("fields, field", [
    ({}, "input"), ({"prompt": ""}, "prompt"), ({"chat": {}}, "chat.messages"),
    ({"chat": {"messages": [{"role": "user"}, {"content": "x"}]}}, "chat.messages[1].role"),
    ({"prompt_token_ids": {}}, "prompt_token_ids.ids"), ({"prompt_token_ids": {"ids": [VOCAB]}}, "prompt_token_ids.ids"),
])
def test_bad_prompts_name_their_field(fields, field):
    with pytest.raises(ServiceError) as info:
        prompt_of(json_format.ParseDict(fields, pb.GenerateRequest()))
    assert [v.field for v in info.value.violations] == [field]


# ---- responses --------------------------------------------------------------------------------


def final_output(**fields) -> RequestOutput:
    values = dict(request_id="e#1", text="Hello.", delta_text=".", token_ids=[5, 6, 2], new_token_ids=[6, 2],
                  finished=True, finish_reason=FinishReason.STOP, stop_reason=2, num_prompt_tokens=9,
                  num_output_tokens=3,
                  counters=RequestCounters(num_cached_tokens=4, num_forward_passes=3, num_forced_tokens=1),
                  timings=RequestTimings(queued_s=0.1, grammar_wait_s=0.05, ttft_s=0.2, total_s=0.5))
    values.update(fields)
    return RequestOutput(**values)


def test_unary_response_carries_everything():
    response = responses.generate_response(final_output(), "client-id", str, delta=False)
    assert (response.request_id, response.text, list(response.token_ids)) == ("client-id", "Hello.", [5, 6, 2])
    assert response.finish_reason == pb.FINISH_REASON_STOP and response.stop_token_id == 2
    assert response.usage == pb.Usage(prompt_tokens=9, completion_tokens=3, cached_prompt_tokens=4, forced_tokens=1)
    assert response.timings == pb.Timings(queued_s=0.1, grammar_wait_s=0.05, time_to_first_token_s=0.2, total_s=0.5,
                                          forward_passes=3)


def test_stream_response_carries_the_delta_and_totals_only_at_the_end():
    last = responses.generate_response(final_output(stop_reason="\n"), "c", str, delta=True)
    assert (last.text, list(last.token_ids), last.stop_string) == (".", [6, 2], "\n")
    middle = responses.generate_response(final_output(finished=False, finish_reason=None, timings=None), "c", str,
                                          delta=True)
    assert middle.finish_reason == pb.FINISH_REASON_UNSPECIFIED
    assert not middle.HasField("usage") and not middle.HasField("timings") and middle.WhichOneof("stop_reason") is None


@pytest.mark.parametrize("reason, expected", [
    (FinishReason.STOP, pb.FINISH_REASON_STOP), (FinishReason.LENGTH, pb.FINISH_REASON_LENGTH),
    (FinishReason.ABORT, pb.FINISH_REASON_CANCELLED), (FinishReason.ERROR, pb.FINISH_REASON_ERROR),
])
def test_finish_reasons(reason, expected):
    response = responses.generate_response(final_output(finish_reason=reason, stop_reason=None), "c", str, False)
    assert response.finish_reason == expected


def test_logprobs_with_token_texts():
    logprobs = [TokenLogprob(5, -0.1, [(5, -0.1), (9, -2.0)])]
    output = final_output(token_ids=[5], logprobs=logprobs, new_logprobs=logprobs)
    response = responses.generate_response(output, "c", lambda t: f"<{t}>", delta=False)
    assert response.logprobs[0] == pb.TokenLogprob(token_id=5, token="<5>", logprob=-0.1, top=[
        pb.TopLogprob(token_id=5, token="<5>", logprob=-0.1), pb.TopLogprob(token_id=9, token="<9>", logprob=-2.0)])


def test_errors_from_engine_outputs():
    compile_error = final_output(token_ids=[], finish_reason=FinishReason.ERROR, error="regex does not compile: x")
    error = error_from_output(compile_error, "constraint.regex")
    assert error.code == ErrorCode.INVALID_ARGUMENT and error.message == "constraint.regex: regex does not compile: x"
    mid_stream = final_output(finish_reason=FinishReason.ERROR, error="grammar dead end")
    error = error_from_output(mid_stream, "constraint.regex")
    assert error.code == ErrorCode.INTERNAL and "after 3 tokens: grammar dead end" in error.message


def test_status_proto_carries_field_violations():
    with pytest.raises(ServiceError) as info:
        params_of(temperature=-1)
    status = status_proto(info.value)
    assert status.code == 3 and status.message == info.value.message
    bad_request = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad_request)
    assert bad_request.field_violations[0].field == "temperature"


def test_model_info_and_validate_response():
    info = EngineCoreReady(model_name="m", model_dir="/x", max_model_len=512, vocab_size=VOCAB, block_size=16,
                           num_total_blocks=99, max_num_seqs=8, max_num_waiting=4)
    stats = EngineStats(num_running=2, num_waiting=1, num_waiting_for_grammar=1, num_free_blocks=90,
                        num_total_blocks=99, num_cached_blocks=3, num_steps=7)
    model = responses.model_info(info, stats, LIMITS, num_in_flight=4)
    assert model.limits.max_num_seqs == 8 and model.limits.max_queue_len == 4 and model.limits.max_tokens_cap == 512
    assert model.load == pb.Load(num_running=2, num_waiting=1, num_waiting_for_grammar=1, num_free_kv_blocks=90,
                                 num_total_kv_blocks=99, num_cached_kv_blocks=3, num_in_flight=4, num_steps=7)
    assert list(model.constraint_kinds) == ["json_schema", "json_object", "regex", "grammar", "choice",
                                            "structural_tag"]
    report = responses.validate_constraint_response(ConstraintReport(ok=False, error="bad"))
    assert not report.ok and report.error == "bad"


def test_limits_are_validated():
    with pytest.raises(ValueError, match="default_max_tokens"):
        ServiceLimits(max_tokens_cap=10, default_max_tokens=20)


# ---- build and import hygiene -----------------------------------------------------------------


def test_generated_stubs_are_fresh():
    assert protogen.stale_files() == [], "run `make proto` (python -m service.protogen)"


def test_service_never_imports_torch():
    code = ("import sys; import service.grpc.server, service.lifecycle, service.cli, service.async_llm, "
            "engine.frontend.mp_client; "
            "assert 'torch' not in sys.modules, 'torch imported'; assert 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)


def test_only_the_grpc_front_end_imports_grpc():
    importers = []
    for path in sorted((REPO_ROOT / "service").rglob("*.py")):
        if "_gen" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n == "grpc" or n.startswith(("grpc.", "grpc_health", "grpc_reflection.v1alpha.reflection"))
                   or n == "grpc_reflection.v1alpha" and any(a.name != "reflection_pb2" for a in node.names)
                   for n in names):
                importers.append(path.relative_to(REPO_ROOT / "service").as_posix())
    assert sorted(set(importers)) == ["grpc/access.py", "grpc/reflection.py", "grpc/server.py", "grpc/servicer.py",
                                      "grpc/status.py"]


def test_engine_core_client_never_imports_grpc():
    code = "import sys; import engine.frontend.mp_client; assert not [m for m in sys.modules if m.startswith('grpc')]"
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)


@pytest.mark.parametrize("fields, field", [
    ({"temperature": 1e100}, "temperature"), ({"temperature": 1e300}, "temperature"),
    ({"temperature": 100.5}, "temperature"), ({"repetition_penalty": 1e-300}, "repetition_penalty"),
    ({"repetition_penalty": 1e100}, "repetition_penalty"), ({"top_p": 1e100}, "top_p"),
])
def test_floats_are_range_checked_not_only_finite(fields, field):
    got_field, message = violation(**fields, constraint={"regex": "[a-z]+"})
    assert got_field == field and message.startswith(f"{field}: must be")


def test_deeply_nested_schema_text_is_a_clear_error():
    for text in ("[" * 100000, '{"items":' * 5000 + "{}" + "}" * 5000):
        with pytest.raises(ServiceError) as info:
            engine_constraint(constraint_from_proto(pb.Constraint(json_schema_text=text)),
                              ServiceLimits(max_constraint_bytes=1 << 20))
        assert info.value.code == ErrorCode.INVALID_ARGUMENT
        assert info.value.message.startswith("constraint.json_schema_text: json_schema is nested too deeply")


def test_a_constraint_error_after_tokens_is_invalid_argument():
    output = final_output(finish_reason=FinishReason.ERROR, error="over max_fill_ms", error_kind=ErrorKind.CONSTRAINT)
    error = error_from_output(output, "constraint.regex")
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert error.message == "constraint.regex: over max_fill_ms (after 3 tokens)"
    assert error.violations[0].field == "constraint.regex"
