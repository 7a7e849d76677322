"""/metrics of a real `formwork serve` (the real model) after a mixed load over gRPC and HTTP:
the counts equal what was sent and answered, histogram counts equal the number of requests, the
grammar's compiles and the engine's steps are counted, and promtool accepts the exposition."""
from __future__ import annotations

from collections import Counter

import grpc
import httpx
import pytest

from live_server import PERSON_SCHEMA, LiveServer, chat, error_of
from observability import OtlpCollector, promtool_check, samples, scrape, value
from service._gen.formwork.v1 import generation_pb2 as pb
from service.observability.metrics import STEP_PHASES

pytestmark = pytest.mark.slow

FINISH = {1: "stop", 2: "length"}  # the proto's FinishReason numbers
# a schema the front end accepts and the grammar compiler refuses (a reference to nothing)
DANGLING_REF = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}, "required": ["a"]}


@pytest.fixture(scope="module")
def collector():
    receiver = OtlpCollector()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="module")
def server(model_dir, collector):
    live = LiveServer("--otlp-endpoint", collector.endpoint)
    yield live
    live.stop()


def test_live_metrics_after_a_mixed_load(server) -> None:
    finished: Counter[tuple[str, str]] = Counter()
    prompt = completion = with_tokens = 0
    calls = [(chat("Say hi.", max_tokens=8, temperature=0), "none"),
             (chat("Say hello.", max_tokens=8, temperature=0), "none"),
             (chat("Ada is 36.", max_tokens=40, temperature=0, constraint={"json_schema": PERSON_SCHEMA}),
              "json_schema"),
             (chat("Bob is 41.", max_tokens=40, temperature=0, constraint={"json_schema": PERSON_SCHEMA}),
              "json_schema"),  # the same schema: a compile-cache hit
             (chat("Three letters.", max_tokens=8, temperature=0, constraint={"regex": "[a-z]{3}"}), "regex")]
    for request, kind in calls:
        response = server.stub.Generate(request, timeout=120)
        finished[(FINISH[response.finish_reason], kind)] += 1
        prompt += response.usage.prompt_tokens
        completion += response.usage.completion_tokens
        with_tokens += response.usage.completion_tokens > 0
    bad = chat("x", max_tokens=8, constraint={"json_schema": DANGLING_REF})
    refused = error_of(server.stub.Generate, bad, timeout=120)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.details()
    finished[("error", "json_schema")] += 1
    # it reached the engine, so its prompt counts too
    prompt += len(server.stub.Tokenize(pb.TokenizeRequest(chat=bad.chat), timeout=30).token_ids)
    answer = httpx.post(f"{server.http_url}/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "Say yes."}], "max_tokens": 6, "temperature": 0}).json()
    finished[(answer["choices"][0]["finish_reason"], "none")] += 1
    prompt += answer["usage"]["prompt_tokens"]
    completion += answer["usage"]["completion_tokens"]
    with_tokens += 1
    server.wait_idle()

    text = scrape(server.http_url)
    parsed = samples(text)
    for (reason, kind), count in finished.items():
        assert value(parsed, "formwork_requests_total", finish_reason=reason, constraint=kind) == count, (reason, kind)
    num_requests = sum(finished.values())
    assert sum(v for (name, _), v in parsed.items() if name == "formwork_requests_total") == num_requests
    assert value(parsed, "formwork_prompt_tokens_total") == prompt
    assert value(parsed, "formwork_generation_tokens_total") == completion
    assert value(parsed, "formwork_requests_rejected_total", api="grpc", code="INVALID_ARGUMENT") == 1
    assert value(parsed, "formwork_e2e_request_latency_seconds_count") == num_requests
    assert value(parsed, "formwork_time_to_first_token_seconds_count") == with_tokens
    assert value(parsed, "formwork_grammar_wait_seconds_count") == 4  # the constrained ones, refused one included
    # compiles: the warm-up's json_object, the person schema, the regex, the dangling reference
    assert value(parsed, "formwork_grammar_compiles_total") == 4
    assert value(parsed, "formwork_grammar_compile_cache_hits_total") >= 1
    # the server's default, auto, put the schema on llguidance, the json_object and the (small) regex on xgrammar;
    # a refusal counts under the name asked for
    assert value(parsed, "formwork_grammar_compile_failures_total", reason="invalid", backend="auto") == 1
    assert value(parsed, "formwork_grammar_compile_seconds_count", backend="xgrammar") == 2
    assert value(parsed, "formwork_grammar_compile_seconds_count", backend="llguidance") == 1
    assert value(parsed, "formwork_grammar_compile_seconds_count", backend="auto") == 1
    num_steps = value(parsed, "formwork_engine_steps_total")
    assert num_steps > 0
    for phase in STEP_PHASES:  # each step that ran a forward pass, once per phase
        assert 0 < value(parsed, "formwork_step_seconds_count", phase=phase) <= num_steps, phase
    assert value(parsed, "formwork_grammar_bitmask_fill_seconds_count") > 0
    assert value(parsed, "formwork_num_requests_running") == 0
    assert value(parsed, "formwork_kv_cache_blocks_used") == 0
    assert value(parsed, "formwork_kv_cache_blocks_capacity") == server.model_info().load.num_total_kv_blocks
    assert value(parsed, "formwork_prefix_cache_blocks") > 0  # the chat template's system prompt, at least

    check = promtool_check(text)
    assert check.returncode == 0, check.stdout + check.stderr


def test_live_traces_reach_an_otlp_collector(server, collector) -> None:
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    server.stub.Generate(chat("Ada is 36.", max_tokens=40, temperature=0, constraint={"json_schema": PERSON_SCHEMA}),
                         timeout=120, metadata=(("traceparent", f"00-{trace_id}-b7ad6b7169203331-01"),))
    spans = collector.wait_for(trace_id, count=5)  # the call and its four phases
    assert collector.content_types[0] == "application/x-protobuf"
    calls = [s for s in spans if s.name == "/formwork.v1.Generation/Generate"]
    assert len(calls) == 1 and calls[0].parent_span_id.hex() == "b7ad6b7169203331"
    attributes = {a.key for a in calls[0].attributes}
    assert {"formwork.request_id", "formwork.ttft_s", "gen_ai.usage.output_tokens"} <= attributes
    children = {s.name for s in spans if s.parent_span_id == calls[0].span_id}
    assert children == {"queue", "grammar_wait", "prefill", "decode"}
