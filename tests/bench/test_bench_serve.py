"""`formwork bench serve`: the load generator against a fake-engine server (fast), the figures it
computes from hand-made records, the peer contract, and (slow) the smoke benchmark end to end."""
from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from bench import report, serve_workloads
from bench.peers import PEERS, Peer, PeerSkipped, records_from_peer, run_peer
from bench.request_record import RequestRecord
from bench.serve import Client, LoadShape, RequestSpec, check_loopback, run_load

REPO_ROOT = Path(__file__).resolve().parents[2]


def make_record(request_id: str = "r#0", token_times_s: tuple[float, ...] = (0.5, 0.6, 0.8), **fields) -> RequestRecord:
    times = list(token_times_s)
    defaults = dict(ok=True, finish_reason="stop", num_output_tokens=len(times), ttft_s=times[0], e2e_s=times[-1],
                    token_counts=[1] * len(times))
    return RequestRecord(request_id, sent_at=0.0, token_times_s=times, **{**defaults, **fields})


def test_percentile_interpolates_like_numpy():
    values = [4.0, 1.0, 3.0, 2.0, 10.0]
    assert report.percentile(values, 50) == 3.0
    assert report.percentile(values, 90) == pytest.approx(7.6)  # numpy.percentile(values, 90)
    assert report.percentile(values, 99) == pytest.approx(9.76)
    assert report.percentile([7.0], 99) == 7.0
    assert report.percentile([], 50) is None


def test_summarize_counts_only_successful_requests():
    records = [make_record("a#0", (0.5, 0.6, 0.8), forward_passes=2, num_forced_tokens=1),
               make_record("b#1", (1.0, 1.1), forward_passes=2),
               RequestRecord("c#2", sent_at=0.0, ok=False, error="UNAVAILABLE: gone", e2e_s=0.1)]
    s = report.summarize(records, wall_s=2.0, system="formwork", mode="constrained", concurrency=2)
    assert (s["num_requests"], s["num_ok"], s["num_errors"]) == (3, 2, 1)
    assert s["errors"] == ["UNAVAILABLE: gone"]
    assert s["output_token_throughput"] == pytest.approx(5 / 2.0)
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["ttft_s_p50"] == pytest.approx(0.75)
    assert s["itl_s_p50"] == pytest.approx(0.1)  # gaps 0.1, 0.2, 0.1
    assert s["tpot_s_p50"] == pytest.approx((0.15 + 0.1) / 2)  # (0.8-0.5)/2 and (1.1-1.0)/1
    assert s["forward_passes_per_output_token"] == pytest.approx(4 / 5)
    assert s["forced_token_share"] == pytest.approx(1 / 5)


def test_load_shape_and_loopback_are_checked():
    with pytest.raises(ValueError, match="exactly one"):
        LoadShape(concurrency=2, rate=1.0)
    with pytest.raises(ValueError, match="exactly one"):
        LoadShape()
    with pytest.raises(ValueError, match="concurrency"):
        LoadShape(concurrency=0)
    with pytest.raises(ValueError, match="rate"):
        LoadShape(rate=-1.0)
    check_loopback("127.0.0.1:5000")
    check_loopback("localhost:5000")
    check_loopback("[::1]:5000")
    for address in ("10.0.0.1:5000", "192.168.1.2:80", "example.com:443"):
        with pytest.raises(ValueError, match="loopback"):
            check_loopback(address)


def test_score_needs_valid_json_matching_the_schema_and_not_capped():
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    spec = RequestSpec("p", [], 64, schema=schema, expected={"name": "Ada", "age": 36}, check_schema=schema)
    assert serve_workloads.score(spec, '{"name": "Ada", "age": 36}', "stop") == (True, 1.0)
    assert serve_workloads.score(spec, '{"name": "Ada", "age": 7}', "stop") == (True, 0.5)
    assert serve_workloads.score(spec, '{"name": "Ada", "age": "x"}', "stop")[0] is False
    assert serve_workloads.score(spec, '{"name": "Ada", "age": 36}', "length")[0] is False
    assert serve_workloads.score(spec, '{"name": "Ad', "length") == (False, 0.0)


def test_workloads_build_the_same_prompts_with_and_without_schema():
    constrained = serve_workloads.build("json-extraction", 128, jump_forward=False)
    unconstrained = serve_workloads.build("unconstrained", 128)
    assert len(constrained) >= 50
    assert [s.messages for s in constrained] == [s.messages for s in unconstrained]
    assert all(s.schema is not None and s.jump_forward is False for s in constrained)
    assert all(s.schema is None and s.check_schema is not None for s in unconstrained)


def test_records_from_peer_and_missing_peer_is_skipped(tmp_path):
    run = {"records": [{"id": "a#0", "text": "{}", "num_output_tokens": 2, "ttft_s": 0.2, "e2e_s": 0.3,
                        "token_times_s": [0.2, 0.3]}]}
    (record,) = records_from_peer(run)
    assert record.ok and record.itl_s == [pytest.approx(0.1)] and record.tpot_s == pytest.approx(0.1)
    absent = Peer("absent", "transformers_peer.py", "no-such-venv", "peer-absent", "")
    with pytest.raises(PeerSkipped, match="make peer-absent"):
        run_peer(absent, {}, timeout_s=5)


@pytest.fixture(scope="module")
def fake_server():
    from inproc_server import InprocServer
    server = InprocServer(step_s=0.01)
    yield server
    server.close()


def _max_overlap(records: list[RequestRecord]) -> int:
    events = sorted([(r.sent_at, 1) for r in records] + [(r.sent_at + r.e2e_s, -1) for r in records])
    level = peak = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    return peak


def _specs(n: int = 3) -> list[RequestSpec]:
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
    return [RequestSpec(f"s{i}", [{"role": "user", "content": f"person {i}"}], 32,
                        schema=schema if i % 2 else None, check_schema=schema) for i in range(n)]


def test_fixed_concurrency_sends_every_request_with_at_most_n_in_flight(fake_server):
    async def go():
        client = Client(f"127.0.0.1:{fake_server.port}", rpc_timeout_s=30)
        try:
            return await run_load(client, _specs(), LoadShape(concurrency=3, max_requests=9))
        finally:
            await client.close()

    result = asyncio.run(go())
    assert len(result.records) == 9 and not result.stopped_by_time
    assert all(r.ok for r in result.records), [r.error for r in result.records]
    assert sorted(r.request_id for r in result.records) == sorted(f"s{i % 3}#{i}" for i in range(9))
    assert _max_overlap(result.records) <= 3
    constrained = [r for r in result.records if r.request_id.startswith("s1")]
    assert all(json.loads(r.text) == {"name": "Ada", "age": 36} for r in constrained)
    for r in result.records:
        assert r.num_output_tokens == sum(r.token_counts) and 0 < r.ttft_s <= r.e2e_s
        assert r.forward_passes == r.num_output_tokens  # the fake core: one token per step
    assert result.wall_s >= max(r.e2e_s for r in result.records)


def test_poisson_arrivals_stop_at_the_time_limit(fake_server):
    async def go():
        client = Client(f"127.0.0.1:{fake_server.port}", rpc_timeout_s=30)
        try:
            return await run_load(client, _specs(), shape)
        finally:
            await client.close()

    shape = LoadShape(rate=20.0, max_requests=1000, max_duration_s=0.5)
    result = asyncio.run(go())
    assert result.stopped_by_time
    # the arrivals are planned from the seed: exactly those before the limit are sent, however slow the machine
    rng, planned_at, num_planned = random.Random(shape.seed), 0.0, 0
    while (planned_at := planned_at + rng.expovariate(shape.rate)) <= shape.max_duration_s:
        num_planned += 1
    assert 2 <= num_planned <= 30 and len(result.records) == num_planned
    assert all(r.ok for r in result.records)


@pytest.mark.slow
def test_smoke_benchmark_runs_and_its_numbers_are_sane(tmp_path):
    """`formwork bench serve --smoke` (what `make bench-smoke` runs) against a real server."""
    out = tmp_path / "smoke.json"
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.run([sys.executable, "-m", "cli.main", "bench", "serve", "--smoke", "--json",
                           "--output", str(out), "--plots-dir", str(tmp_path)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["problems"] == []
    runs = {r["mode"]: r for r in summary["runs"]}
    assert set(runs) == {"unconstrained", "constrained+jf"}
    structured = runs["constrained+jf"]
    assert structured["num_requests"] == 8 and structured["num_finished_invalid"] == 0
    assert structured["num_valid"] >= 6  # at max_tokens 64 an answer may run long (LENGTH), never invalid
    assert structured["forward_passes_per_output_token"] < 1.0  # jump-forward saved passes
    assert json.loads(out.read_text())["runs"][0]["cdf"]["itl_s"]
    assert {Path(p).name for p in summary["plots"]} >= {"serve-throughput.png", "serve-latency-cdf.png"}


def test_a_peers_options_reach_its_payload(tmp_path):
    script = tmp_path / "echo_peer.py"
    script.write_text("import json, sys\nprint(json.dumps({'runs': [], 'got': json.load(sys.stdin)}))\n")
    peer = Peer("echo", str(script), None, None, "", {"compiled": True})
    assert run_peer(peer, {"runs": [], "threads": 2}, timeout_s=30)["got"] == {"runs": [], "threads": 2,
                                                                               "compiled": True}
    assert PEERS["vllm-compiled"].options == {"compiled": True} and not PEERS["vllm"].options
