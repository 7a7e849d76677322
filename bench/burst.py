"""The new-schema burst of `formwork bench serve --burst`: what compiling grammars costs the
requests already running.

Steady json-extraction requests run at a fixed concurrency while a burst of mixed-schema requests
arrives, in three phases of equal length: no burst, a burst of schemas compiled beforehand, and a
burst of schemas never seen (their grammars compile while the steady requests decode). The
inter-token gaps of the steady requests inside each window are compared.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from bench import report, serve_workloads
from bench.request_record import RequestRecord
from bench.serve import Client, LoadShape, RequestSpec, compile_all, log, run_load


def _gaps_in_window(records: list[RequestRecord], start: float, end: float) -> list[float]:
    gaps = []
    for r in records:
        times = [r.sent_at + t for t in r.token_times_s]
        gaps += [b - a for a, b in zip(times, times[1:]) if start <= b <= end]
    return gaps


async def burst_test(client: Client, steady_concurrency: int = 8, burst_size: int = 16, window_s: float = 10.0,
                     max_tokens: int = 128, repeats: int = 2) -> dict:
    """Inter-token latency of steady json-extraction requests while a burst of mixed schemas
    arrives: schemas already compiled (A) vs never seen (B), alternated A B A B, plus no burst.
    The window is the same length in every phase, so A and B differ only by the compiles."""
    steady = serve_workloads.json_extraction(max_tokens, jump_forward=True)
    await compile_all(client, steady)
    seen = serve_workloads.mixed_schemas(8, limit=burst_size, title="formwork bench: seen")
    seen, _ = await compile_all(client, seen)
    lead_s = 3.0

    async def phase(burst: list[RequestSpec] | None) -> tuple[list[float], list[RequestRecord]]:
        steady_shape = LoadShape(concurrency=steady_concurrency, max_requests=10_000, max_duration_s=lead_s + window_s)
        steady_task = asyncio.create_task(run_load(client, steady, steady_shape))
        await asyncio.sleep(lead_s)
        start = time.monotonic()
        burst_records: list[RequestRecord] = []
        if burst:
            burst_task = asyncio.create_task(run_load(client, burst, LoadShape(concurrency=len(burst),
                                                                                max_requests=len(burst))))
        steady_result = await steady_task
        if burst:
            burst_records = (await burst_task).records
        return _gaps_in_window(steady_result.records, start, start + window_s), burst_records

    phases: dict[str, list[float]] = {"none": [], "seen": [], "new": []}
    new_waits, errors = [], []
    for i in range(repeats):
        for name in ("none", "seen", "new"):
            burst = None
            if name == "seen":
                burst = seen
            elif name == "new":
                burst = [replace(s, jump_forward=True) for s in
                         serve_workloads.mixed_schemas(8, limit=burst_size, title=f"formwork bench: new {time.time_ns()}")]
            log(f"burst phase {i + 1}/{repeats}: {name}")
            gaps, records = await phase(burst)
            phases[name] += gaps
            errors += [r.error for r in records if not r.ok and "INVALID_ARGUMENT" not in r.error]
            if name == "new":
                new_waits += [r.server_grammar_wait_s for r in records if r.ok]
    stats = {name: {"num_gaps": len(g), "itl_mean_s": sum(g) / len(g) if g else None,
                    **{f"itl_p{p}_s": report.percentile(g, p) for p in report.PERCENTILES}}
             for name, g in phases.items()}
    seen_mean, new_mean = stats["seen"]["itl_mean_s"], stats["new"]["itl_mean_s"]
    return {"steady_concurrency": steady_concurrency, "burst_size": burst_size, "window_s": window_s,
            "repeats": repeats, "phases": stats,
            "new_vs_seen_itl_mean": new_mean / seen_mean if seen_mean and new_mean else None,
            "new_vs_seen_itl_p50": (stats["new"]["itl_p50_s"] / stats["seen"]["itl_p50_s"]
                                    if stats["seen"]["itl_p50_s"] and stats["new"]["itl_p50_s"] else None),
            "new_burst_grammar_wait_s": {f"p{p}": report.percentile(new_waits, p) for p in report.PERCENTILES},
            "errors": errors[:5]}
