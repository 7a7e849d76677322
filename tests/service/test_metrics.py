"""Prometheus metrics, request log lines and traces against a fake engine core (fast; no model):
counts scraped from /metrics equal what was sent over gRPC and HTTP, promtool accepts the
exposition, a real Prometheus server scrapes it, and a trace has its spans and attributes.
tests/integration/test_metrics_live.py does the same against the real model."""
from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

import grpc
import httpx
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from engine.log_format import JsonFormatter
from engine.protocol import StepStats
from live_server import chat, error_of
from observability import PrometheusServer, family_names, promtool_check, samples, scrape, value
from service.observability.metrics import STEP_PHASES, ServiceMetrics
from service.observability.telemetry import Telemetry
from service.observability.tracing import Tracing
from inproc_server import InprocHttp

PLAIN = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "formwork-dashboard.json"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"


def _grpc_stub(server: InprocHttp):
    from service._gen.formwork.v1 import generation_pb2_grpc as pb_grpc
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    return channel, pb_grpc.GenerationStub(channel)


def _mixed_load(server: InprocHttp) -> dict:
    """3 plain and 2 json_object calls over gRPC, 2 plain over HTTP, and one bad call on each;
    what was sent and answered."""
    channel, stub = _grpc_stub(server)
    sent = {"prompt": 0, "completion": 0, "length": 0, "stop_json": 0}
    with channel:
        for _ in range(3):
            response = stub.Generate(chat("hi", max_tokens=5), timeout=30)
            assert response.finish_reason == 2  # LENGTH
            sent["length"] += 1
            sent["prompt"] += response.usage.prompt_tokens
            sent["completion"] += response.usage.completion_tokens
        for _ in range(2):
            response = stub.Generate(chat("json", max_tokens=64, constraint={"json_object": {}}), timeout=30)
            assert response.finish_reason == 1  # STOP
            sent["stop_json"] += 1
            sent["prompt"] += response.usage.prompt_tokens
            sent["completion"] += response.usage.completion_tokens
        assert error_of(stub.Generate, chat("hi", max_tokens=5, temperature=-1), timeout=30).code() == \
            grpc.StatusCode.INVALID_ARGUMENT
    for _ in range(2):
        answer = httpx.post(f"{server.url}/v1/chat/completions", json=PLAIN, timeout=30).json()
        assert answer["choices"][0]["finish_reason"] == "length"
        sent["length"] += 1
        sent["prompt"] += answer["usage"]["prompt_tokens"]
        sent["completion"] += answer["usage"]["completion_tokens"]
    bad = httpx.post(f"{server.url}/v1/chat/completions", content=b"{not json", timeout=30)
    assert bad.status_code == 400
    assert server.wait_idle()
    return sent


def test_metrics_count_what_was_sent(make_http_server) -> None:
    server = make_http_server(telemetry=Telemetry(ServiceMetrics()))
    sent = _mixed_load(server)
    text = scrape(server.url)
    parsed = samples(text)
    num_requests = sent["length"] + sent["stop_json"]

    assert value(parsed, "formwork_requests_total", finish_reason="length", constraint="none") == sent["length"]
    assert value(parsed, "formwork_requests_total", finish_reason="stop", constraint="json_object") == \
        sent["stop_json"]
    assert value(parsed, "formwork_prompt_tokens_total") == sent["prompt"]
    assert value(parsed, "formwork_generation_tokens_total") == sent["completion"]
    assert value(parsed, "formwork_requests_rejected_total", api="grpc", code="INVALID_ARGUMENT") == 1
    assert value(parsed, "formwork_requests_rejected_total", api="http", code="INVALID_ARGUMENT") == 1
    for histogram in ("formwork_e2e_request_latency_seconds", "formwork_time_to_first_token_seconds",
                      "formwork_request_queue_time_seconds", "formwork_inter_token_latency_seconds"):
        assert value(parsed, f"{histogram}_count") == num_requests, histogram
    assert value(parsed, "formwork_grammar_wait_seconds_count") == sent["stop_json"]
    # the engine's steps (the warm-up's too): one observation per step in each phase
    assert server.core is not None
    num_steps = server.core.num_steps
    assert value(parsed, "formwork_engine_steps_total") == num_steps > 0
    for phase in STEP_PHASES:
        assert value(parsed, "formwork_step_seconds_count", phase=phase) == num_steps, phase
    assert value(parsed, "formwork_step_batch_size_count") == num_steps
    # gauges, read at the scrape: nothing runs, every block is free
    assert value(parsed, "formwork_num_requests_running") == 0
    assert value(parsed, "formwork_kv_cache_blocks_used") == 0
    assert value(parsed, "formwork_kv_cache_blocks_capacity") == server.core.num_total_blocks

    check = promtool_check(text)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_real_prometheus_scrapes_the_server(make_http_server) -> None:
    server = make_http_server(telemetry=Telemetry(ServiceMetrics()))
    sent = _mixed_load(server)
    prometheus = PrometheusServer(server.url.removeprefix("http://"))
    try:
        result = prometheus.wait_for('formwork_requests_total{finish_reason="length"}')
        assert float(result[0]["value"][1]) == sent["length"]
        up = prometheus.query('up{job="formwork"}')
        assert float(up[0]["value"][1]) == 1
        # every expression of the Grafana dashboard parses and names metrics the server exports
        exported = family_names(scrape(server.url))
        expressions = [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]]
        assert len(expressions) > 20
        for expression in expressions:
            prometheus.query(expression.replace("$__rate_interval", "1m"))  # raises on a bad expression
            for name in re.findall(r"formwork_[a-z0-9_]+", expression):
                assert re.sub(r"_(total|bucket|sum|count)$", "", name) in exported, (name, expression)
    finally:
        prometheus.stop()


def test_metrics_off_answers_404(make_http_server) -> None:
    server = make_http_server(telemetry=Telemetry(metrics=None))
    response = httpx.get(f"{server.url}/metrics", timeout=10)
    assert response.status_code == 404
    assert "--no-metrics" in response.json()["error"]["message"]


def test_engine_totals_grow_counters_and_survive_a_restart() -> None:
    metrics = ServiceMetrics()
    metrics.engine_steps(StepStats(num_steps=5, num_preemptions=2, num_compile_cache_misses=3,
                                   compile_failures={"xgrammar": {"timeout": 1}}, compile_s=[0.01, 0.2, 0.03],
                                   compile_backends=["xgrammar", "llguidance", "llguidance"]))
    metrics.engine_steps(StepStats(num_steps=7, num_preemptions=2, num_compile_cache_misses=4,
                                   compile_failures={"xgrammar": {"timeout": 1, "invalid": 2}, "auto": {"invalid": 1}}))
    metrics.engine_restarted()  # a new core starts from zero
    metrics.engine_steps(StepStats(num_steps=1, num_compile_cache_misses=1))
    parsed = samples(metrics.render(None, 0).decode())
    assert value(parsed, "formwork_engine_steps_total") == 8
    assert value(parsed, "formwork_preemptions_total") == 2
    assert value(parsed, "formwork_grammar_compiles_total") == 5
    assert value(parsed, "formwork_grammar_compile_failures_total", reason="timeout", backend="xgrammar") == 1
    assert value(parsed, "formwork_grammar_compile_failures_total", reason="invalid", backend="xgrammar") == 2
    assert value(parsed, "formwork_grammar_compile_failures_total", reason="invalid", backend="auto") == 1
    assert value(parsed, "formwork_grammar_compile_seconds_count", backend="xgrammar") == 1
    assert value(parsed, "formwork_grammar_compile_seconds_count", backend="llguidance") == 2


def test_closed_early_answers_are_counted_by_reason() -> None:
    from engine.frontend.output_processor import RequestOutput
    from engine.protocol import FinishReason

    metrics = ServiceMetrics()
    for reason in ("budget", "budget", "repetition", ""):
        metrics.request_finished(RequestOutput("r", "{}", "", [1], [], finished=True, finish_reason=FinishReason.STOP,
                                               num_output_tokens=1, closed_early=reason), None)
    parsed = samples(metrics.render(None, 0).decode())
    assert value(parsed, "formwork_requests_closed_early_total", reason="budget") == 2
    assert value(parsed, "formwork_requests_closed_early_total", reason="repetition") == 1
    assert value(parsed, "formwork_requests_total", finish_reason="stop", constraint="none") == 4


def test_draft_tokens_are_counted_with_the_accepted_ones() -> None:
    from engine.frontend.output_processor import RequestOutput
    from engine.protocol import FinishReason, RequestCounters

    metrics = ServiceMetrics()
    for drafted, accepted in ((12, 5), (0, 0), (4, 4)):
        metrics.request_finished(RequestOutput("r", "{}", "", [1], [], finished=True, finish_reason=FinishReason.STOP,
                                               num_output_tokens=1, counters=RequestCounters(
                                                   num_draft_tokens=drafted, num_accepted_draft_tokens=accepted)),
                                 None)
    parsed = samples(metrics.render(None, 0).decode())
    assert value(parsed, "formwork_spec_decode_draft_tokens_total") == 16
    assert value(parsed, "formwork_spec_decode_accepted_tokens_total") == 9


def test_one_log_line_per_finished_request(make_http_server, caplog) -> None:
    server = make_http_server()
    caplog.set_level(logging.INFO, logger="service.request_log")
    channel, stub = _grpc_stub(server)
    with channel:
        stub.Generate(chat("hi", max_tokens=5, request_id="log-me"), timeout=30)
        stub.Generate(chat("json", max_tokens=64, constraint={"json_object": {}}, request_id="log-json"), timeout=30)
    records = [r for r in caplog.records if r.name == "service.request_log"]
    assert [r.request["id"].split("#")[0] for r in records] == ["log-me", "log-json"]
    plain, constrained = (r.request for r in records)
    assert plain["status"] == "length" and plain["output_tokens"] == 5 and plain["constraint"] == "none"
    assert constrained["status"] == "stop" and constrained["constraint"] == "json_object"
    assert set(plain) >= {"prompt_tokens", "cached_tokens", "forced_tokens", "queued_s", "ttft_s", "total_s",
                          "grammar_cache_hit"}
    assert "log-me" in records[0].getMessage() and "5 output tokens" in records[0].getMessage()
    line = json.loads(JsonFormatter().format(records[1]))
    assert line["level"] == "INFO" and line["logger"] == "service.request_log"
    assert line["request"] == constrained and line["message"] == records[1].getMessage()


def _spans_by_name(exporter: InMemorySpanExporter, server_span: str) -> dict[str, list]:
    """name -> finished spans, once the server span has ended (just after the answer is sent)."""
    deadline = time.monotonic() + 10
    while True:
        out: dict[str, list] = {}
        for span in exporter.get_finished_spans():
            out.setdefault(span.name, []).append(span)
        if any(server_span in name for name in out) or time.monotonic() > deadline:
            return out
        time.sleep(0.01)


def test_a_grpc_call_is_traced_with_the_engine_timings(make_http_server) -> None:
    exporter = InMemorySpanExporter()
    server = make_http_server(telemetry=Telemetry(tracing=Tracing(exporter, batch=False)), compile_s=0.05)
    channel, stub = _grpc_stub(server)
    with channel:
        stub.Generate(chat("json", max_tokens=64, constraint={"json_object": {}}), timeout=30,
                      metadata=(("traceparent", f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"),))
    spans = _spans_by_name(exporter, "/formwork.v1.Generation/Generate")
    (call,) = spans["/formwork.v1.Generation/Generate"]
    assert format(call.context.trace_id, "032x") == TRACE_ID  # the caller's trace continues
    assert format(call.parent.span_id, "016x") == PARENT_SPAN_ID
    attributes = call.attributes
    assert attributes["formwork.constraint"] == "json_object" and attributes["formwork.finish_reason"] == "stop"
    assert attributes["gen_ai.usage.output_tokens"] > 0 and attributes["formwork.grammar_wait_s"] >= 0.05
    for name in ("queue", "grammar_wait", "prefill", "decode"):
        (child,) = spans[name]
        assert child.parent.span_id == call.context.span_id, name
        assert child.context.trace_id == call.context.trace_id
        assert child.attributes["formwork.request_id"] == attributes["formwork.request_id"]
        assert call.start_time <= child.start_time <= child.end_time <= call.end_time, name
    # the phases follow each other: first scheduled, then first token, then finished
    assert spans["grammar_wait"][0].end_time <= spans["queue"][0].end_time + 1_000_000
    assert spans["queue"][0].end_time <= spans["prefill"][0].end_time <= spans["decode"][0].end_time


def test_an_http_request_is_traced_from_its_traceparent_header(make_http_server) -> None:
    exporter = InMemorySpanExporter()
    server = make_http_server(telemetry=Telemetry(tracing=Tracing(exporter, batch=False)))
    answer = httpx.post(f"{server.url}/v1/chat/completions", json=PLAIN, timeout=30,
                        headers={"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"})
    assert answer.status_code == 200
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200  # polled routes get no span
    spans = _spans_by_name(exporter, "chat/completions")
    (request,) = [s for name, group in spans.items() if "chat/completions" in name for s in group]
    assert format(request.context.trace_id, "032x") == TRACE_ID
    assert format(request.parent.span_id, "016x") == PARENT_SPAN_ID
    assert request.attributes["gen_ai.usage.output_tokens"] == 5
    assert request.attributes["formwork.constraint"] == "none"
    assert {"queue", "prefill", "decode"} <= set(spans) and "grammar_wait" not in spans
    assert spans["decode"][0].parent.span_id == request.context.span_id
    assert not any("health" in name for name in _spans_by_name(exporter, "chat/completions"))


def test_a_grpc_stream_is_traced_too(make_http_server) -> None:
    exporter = InMemorySpanExporter()
    server = make_http_server(telemetry=Telemetry(tracing=Tracing(exporter, batch=False)))
    channel, stub = _grpc_stub(server)
    with channel:
        chunks = list(stub.GenerateStream(chat("hi", max_tokens=3), timeout=30))
    assert chunks[-1].finish_reason == 2  # LENGTH
    spans = _spans_by_name(exporter, "/formwork.v1.Generation/GenerateStream")
    (call,) = spans["/formwork.v1.Generation/GenerateStream"]
    assert call.attributes["gen_ai.usage.output_tokens"] == 3
    assert spans["decode"][0].parent.span_id == call.context.span_id
