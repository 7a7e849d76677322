"""`formwork bench grammar-backends`: its never-seen schemas, its turn order, its summaries from
hand-made records and step timings, and the backend a request names on the wire (all fast)."""
from __future__ import annotations

import json

import pytest

from bench.grammar_backends import BACKENDS, fill_summary, fresh_specs, served_summary, turn_order
from bench.request_record import RequestRecord
from bench.serve import RequestSpec, generate_request
from engine.core.step_timer import StepTiming
from service._gen.formwork.v1 import generation_pb2 as pb


def make_spec(request_id: str = "Github_easy/o1", schema: dict | None = None) -> RequestSpec:
    schema = schema if schema is not None else {"type": "object", "properties": {"a": {"type": "integer"}},
                                                "required": ["a"]}
    return RequestSpec(request_id=request_id, messages=[{"role": "user", "content": "x"}], max_tokens=16,
                       schema=schema, check_schema=schema)


def make_step(num_rows: int, fill_s: float, forward_s: float) -> StepTiming:
    return StepTiming(num_reqs=num_rows, num_tokens=num_rows, num_bitmask_rows=num_rows, schedule_s=0.0,
                      forward_s=forward_s, fill_s=fill_s, total_s=forward_s + 0.001)


def test_fresh_specs_give_every_request_a_schema_text_of_its_own():
    base = [make_spec("s/1"), make_spec("s/2", {"type": "string", "title": "kept out"})]
    first = fresh_specs(base, "llguidance", "run r0")
    again = fresh_specs(base, "xgrammar", "run r0")
    texts = [json.dumps(s.schema, sort_keys=True) for s in first + again]
    assert len(set(texts)) == 4  # distinct across requests and backends: no compile cache holds any
    assert [s.grammar_backend for s in first] == ["llguidance"] * 2
    assert first[1].schema == {"type": "string", "title": "run r0 llguidance 1"}
    assert first[1].check_schema == first[1].schema
    assert first[0].messages == base[0].messages  # the prompt (and its prefix cache) is the same
    assert len({s.request_id for s in first + again}) == 4
    assert base[1].schema["title"] == "kept out"  # the workload's own specs are left alone


def test_turn_order_rotates_so_each_backend_goes_first_in_turn():
    orders = [turn_order(BACKENDS, r) for r in range(3)]
    assert [o[0] for o in orders] == list(BACKENDS)
    assert all(sorted(o) == sorted(BACKENDS) for o in orders)
    assert turn_order(BACKENDS, 3) == orders[0]


def test_served_summary_counts_the_backend_that_served_and_scores_against_the_fresh_schema():
    spec = fresh_specs([make_spec()], "auto", "t")[0]
    records = [RequestRecord(f"{spec.request_id}#0", sent_at=0.0, ok=True, text='{"a": 1}', finish_reason="stop",
                             num_output_tokens=3, ttft_s=0.2, e2e_s=0.4, token_times_s=[0.2, 0.3, 0.4],
                             token_counts=[1, 1, 1], grammar_backend="llguidance", server_grammar_wait_s=0.01),
               RequestRecord(f"{spec.request_id}#1", sent_at=0.0, ok=True, text='{"a": "x"}', finish_reason="stop",
                             num_output_tokens=2, ttft_s=0.6, e2e_s=0.7, token_times_s=[0.6, 0.7],
                             token_counts=[1, 1], grammar_backend="xgrammar", server_grammar_wait_s=0.03)]
    summary = served_summary(records, 2.0, {spec.request_id: spec})
    assert summary["served_by"] == {"llguidance": 1, "xgrammar": 1}
    assert summary["num_valid"] == 1  # "x" is not an integer
    assert summary["output_token_throughput"] == pytest.approx(5 / 2.0)
    assert summary["grammar_wait_s_p50"] == pytest.approx(0.02)


def test_fill_summary_reads_only_the_steps_with_a_full_batch_of_rows():
    steps = [make_step(64, 0.002, 0.100), make_step(64, 0.004, 0.120), make_step(64, 0.150, 0.110),
             make_step(12, 0.500, 0.050)]
    summary = fill_summary(steps)
    assert summary["num_steps"] == 3
    assert summary["fill_ms_p50"] == pytest.approx(4.0)
    assert summary["forward_ms_p50"] == pytest.approx(110.0)
    assert summary["num_fill_over_forward"] == 1
    assert fill_summary([make_step(8, 0.1, 0.1)])["fill_ms_p50"] is None


@pytest.mark.parametrize("backend, wire", [("xgrammar", pb.GRAMMAR_BACKEND_XGRAMMAR),
                                           ("llguidance", pb.GRAMMAR_BACKEND_LLGUIDANCE),
                                           ("auto", pb.GRAMMAR_BACKEND_AUTO)])
def test_a_spec_names_its_backend_on_the_constraint(backend, wire):
    from dataclasses import replace
    request = generate_request(replace(make_spec(), grammar_backend=backend))
    assert request.constraint.grammar_backend == wire
    assert not generate_request(make_spec()).constraint.HasField("grammar_backend")
