"""Hostile requests against a live server: nothing a client sends may take the service down.

The fuzz tests send generated bad requests (tests/support/fuzz_requests.py) with good ones interleaved
and check every answer: no INTERNAL or UNKNOWN, no hang, the engine alive after each batch, the
good outputs valid. The short run is part of the normal suite; `make fuzz` runs the long one
(FORMWORK_FUZZ_SECONDS, default 600). The two requests that used to kill the engine (a huge
regex count, an unsatisfiable recursive schema) and the one that stalled every step have their
own regression tests, each beside a concurrent request that must complete.
"""
from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from fuzz_requests import RECURSIVE_SCHEMA, run_fuzz
from live_server import LiveServer, chat, error_of, field_violations

from service._gen.formwork.v1 import generation_pb2 as pb

pytestmark = pytest.mark.slow

SHORT_BUDGET_S = 20.0  # a sample of every kind of case; the long run (make fuzz) is the one that searches
REGRESSION_TIMEOUT_S = 60.0  # the bomb's own deadline: an answer past it is a hang


@pytest.fixture(scope="module")
def server(default_server):
    return default_server


def engine_check(server: LiveServer, pid: int):
    def check() -> str | None:
        if not Path(f"/proc/{pid}").exists():
            return f"the engine process {pid} is gone"
        try:
            server.model_info()
        except grpc.RpcError as e:
            return f"GetModelInfo failed: {e.code().name} {e.details()}"
        return None
    return check


def run_and_check(server: LiveServer, seed: int, budget_s: float) -> dict:
    pid = server.engine_pid
    report = run_fuzz(server.channel, seed, budget_s, after_batch=engine_check(server, pid))
    summary = report.summary()
    print("fuzz summary:", json.dumps(summary))
    assert not report.problems, "\n".join(report.problems[:20])
    assert report.num_sent > 0 and report.num_good > 0 and report.num_good_valid == report.num_good
    assert not {"INTERNAL", "UNKNOWN", "HANG"} & set(report.codes)
    assert server.engine_pid == pid  # no crash, no restart
    load = server.wait_idle(30)
    assert load.num_in_flight == 0 and load.num_free_kv_blocks == load.num_total_kv_blocks, load
    log = server.log()
    assert "Traceback" not in log, log
    return summary


def test_fuzz_short(server):
    run_and_check(server, seed=int(os.environ.get("FORMWORK_FUZZ_SEED", "23")), budget_s=SHORT_BUDGET_S)


@pytest.mark.skipif(not os.environ.get("FORMWORK_FUZZ_SECONDS"), reason="the long fuzz run: make fuzz")
def test_fuzz_long(server):
    summary = run_and_check(server, seed=int(os.environ.get("FORMWORK_FUZZ_SEED", "2311")),
                            budget_s=float(os.environ["FORMWORK_FUZZ_SECONDS"]))
    out = Path(os.environ.get("FORMWORK_FUZZ_REPORT", "build/fuzz.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")


@pytest.mark.parametrize("constraint", [
    {"regex": "a{99999999999}"},
    {"json_schema_text": json.dumps(RECURSIVE_SCHEMA)},
    {"regex": "(a{1000}){1000}"},
    {"json_schema": {"type": "string", "pattern": "(a{1000}){1000}"}},
], ids=["huge-regex-count", "recursive-required-schema", "nested-counts", "nested-counts-pattern"])
def test_bomb_fails_alone_while_another_request_completes(server, constraint):
    kind = next(iter(constraint))
    with ThreadPoolExecutor(1) as pool:
        other = pool.submit(server.stub.Generate, chat("Count from one to thirty.", max_tokens=40, temperature=0),
                            timeout=120)
        time.sleep(0.3)  # let it start decoding
        bomb = chat("Write something.", max_tokens=8, constraint={**constraint, "jump_forward": True})
        error = error_of(server.stub.Generate, bomb, timeout=REGRESSION_TIMEOUT_S)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
        assert f"constraint.{kind}" in field_violations(error), error.details()
        response = other.result()
    assert response.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH)
    assert response.usage.completion_tokens > 0
    report = server.stub.ValidateConstraint(pb.ValidateConstraintRequest(
        constraint=chat("x", constraint=constraint).constraint), timeout=REGRESSION_TIMEOUT_S)
    assert not report.ok and report.error
    assert server.wait_idle(10).num_in_flight == 0
