"""Soak: 200 concurrent schema-constrained streams against a live server for a long while.

Opt-in (`make soak`, or FORMWORK_SOAK_S=<seconds> pytest tests/integration/test_soak.py; FORMWORK_SOAK_STREAMS
for fewer streams than 200): it is slow-marked and skipped unless FORMWORK_SOAK_S is set, so `make
test` never runs it. It checks that nothing leaks:
no errors, every output valid, the engine's and the front end's RSS flat over the second half,
every KV block free and nothing in flight at the end, and no engine restart.

The engine's RSS grows while new step shapes appear, less since its heap settings (a fixed malloc
mmap threshold, bounded oneDNN primitive caches, a periodic trim: docs/reliability.md, "Soak"), so
the first half is its warm-up and only the second half has to be flat.
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import jsonschema
import pytest

from live_server import PERSON_SCHEMA, LiveServer, chat

pytestmark = pytest.mark.slow

NUM_STREAMS = int(os.environ.get("FORMWORK_SOAK_STREAMS") or 200)  # fewer for a short run on a shared machine
SOAK_S = float(os.environ.get("FORMWORK_SOAK_S") or 0)
SAMPLE_EVERY_S = 10.0
WARM_UP_FRACTION = 0.5  # RSS is compared from here on
RSS_SLACK_BYTES = 64 << 20
RSS_SLACK_FRACTION = 0.05


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


@dataclass
class Tally:
    num_ok: int = 0
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def stream_until(server: LiveServer, worker: int, end: float, tally: Tally) -> None:
    iteration = 0
    while time.monotonic() < end:
        request = chat(f"Invent person number {worker}-{iteration}. Answer in JSON.", max_tokens=48,
                       temperature=0.8, seed=worker * 100_000 + iteration, constraint={"json_schema": PERSON_SCHEMA})
        try:
            text = "".join(m.text for m in server.stub.GenerateStream(request, timeout=300))
            jsonschema.validate(json.loads(text), PERSON_SCHEMA)
        except (grpc.RpcError, ValueError, jsonschema.ValidationError) as e:
            with tally.lock:
                tally.errors.append(f"{type(e).__name__}: {e}"[:300])
        else:
            with tally.lock:
                tally.num_ok += 1
        iteration += 1


@pytest.mark.skipif(SOAK_S <= 0, reason="opt-in: set FORMWORK_SOAK_S to the soak's length in seconds (make soak)")
def test_soak_200_constrained_streams_leak_nothing():
    server = LiveServer("--num-blocks", "1024", "--max-queue-len", "1024")
    try:
        engine_pid, front_pid = server.engine_pid, server.process.pid
        started = time.monotonic()
        end = started + SOAK_S
        tally = Tally()
        workers = [threading.Thread(target=stream_until, args=(server, i, end, tally), daemon=True)
                   for i in range(NUM_STREAMS)]
        for worker in workers:
            worker.start()
        samples = []  # (seconds since start, engine RSS, front-end RSS, load)
        while time.monotonic() < end:
            time.sleep(min(SAMPLE_EVERY_S, max(end - time.monotonic(), 0.0)))
            samples.append((time.monotonic() - started, rss_bytes(engine_pid), rss_bytes(front_pid),
                            server.model_info().load))
        for worker in workers:
            worker.join(timeout=300)
        load = server.wait_idle(timeout_s=60)
        engine_end, front_end = rss_bytes(engine_pid), rss_bytes(front_pid)
        baseline = next(s for s in samples if s[0] >= WARM_UP_FRACTION * SOAK_S)
        info = server.model_info()
        peak_running = max(s[3].num_running for s in samples)
        print(f"soak {SOAK_S:.0f} s, {NUM_STREAMS} streams: {tally.num_ok} requests ok, {len(tally.errors)} errors; "
              f"engine RSS {samples[0][1] / 2**20:.0f} MiB at {samples[0][0]:.0f} s, {baseline[1] / 2**20:.0f} MiB at "
              f"{baseline[0]:.0f} s, {engine_end / 2**20:.0f} MiB at the end; front end {baseline[2] / 2**20:.0f} -> "
              f"{front_end / 2**20:.0f} MiB; KV blocks free {load.num_free_kv_blocks}/{load.num_total_kv_blocks}; "
              f"peak running {peak_running}, max waiting {max(s[3].num_waiting for s in samples)}")
        print("engine RSS (s: MiB): " + ", ".join(f"{t:.0f}: {rss / 2**20:.0f}" for t, rss, _, _ in samples))
        assert not tally.errors, tally.errors[:5]
        assert tally.num_ok > NUM_STREAMS
        assert load.num_in_flight == load.num_running == load.num_waiting == 0, load
        assert load.num_free_kv_blocks == load.num_total_kv_blocks, load
        for end_rss, baseline_rss in ((engine_end, baseline[1]), (front_end, baseline[2])):
            assert end_rss <= baseline_rss * (1 + RSS_SLACK_FRACTION) + RSS_SLACK_BYTES, samples
        # one cached schema: nobody waits for a grammar, the rest wait for a batch slot
        assert all(s[3].num_waiting_for_grammar == 0 for s in samples[1:]), [s[3] for s in samples]
        assert info.num_engine_restarts == 0
    finally:
        assert server.stop(timeout_s=60) == 0, server.log()
