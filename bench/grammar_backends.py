"""`formwork bench grammar-backends`: xgrammar, llguidance and auto side by side, every request a
schema the server has never seen.

    formwork bench grammar-backends                       # c=1 and c=16, then the fill at batch 64
    formwork bench grammar-backends --concurrency 1 --rounds 1 --skip-fill

Served: one `formwork serve` (started here, or --address), the mixed-schemas workload, jump-forward
on and speculation off (mode constrained+jf), each request naming its backend
(Constraint.grammar_backend). Every request's schema gets a title of its own, in the constraint and
not the prompt: the compile cache (keyed by the schema's text) misses, so the time to the first
token includes the compile, as it does for a client with a new schema. At each concurrency the
backends take turns in rounds (the order rotated each round, the same schemas for each backend in
a round), so that the machine's other load weighs on them alike. Per backend: TTFT, the server's
grammar wait (the compile inside the TTFT), output tokens/s, ITL, validity, and the backends that
auto chose.

Fill: then in this process an engine configured as the server, 128 requests with new schemas of
one backend at a time, 64 running at once; over the steps with 64 bitmask rows, the fill on the engine thread (which
runs beside the forward, engine/core/step_timer.py) against the forward, and how many steps the
fill outlasted the forward (the steps it was not hidden).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from bench import report, serve_workloads
from bench.serve import Client, LoadShape, RequestSpec, log, run_load
from bench.serve_bench import SERVER_ARGS, machine

if TYPE_CHECKING:
    from bench.request_record import RequestRecord
    from engine.core.step_timer import StepTiming
    from engine.llm import LLM
    from grammar.constraint import Constraint

BACKENDS = ("xgrammar", "llguidance", "auto")
FILL_BATCH = 64


def add_parser(which) -> None:
    parser = which.add_parser("grammar-backends",
                              help="xgrammar, llguidance and auto on never-seen schemas: TTFT, tok/s, fill at batch 64")
    parser.add_argument("--address",
                        help="a running server on loopback (default: start one with bench serve's options)")
    parser.add_argument("--concurrency", type=_csv_int, default=[1, 16], help="comma list (default: 1,16)")
    parser.add_argument("--rounds", type=int, default=2, help="turns of every backend at each concurrency (default: 2)")
    parser.add_argument("--requests", type=int, default=4,
                        help="requests per turn at concurrency 1; a turn at concurrency c sends max(c, this)")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--fill-max-tokens", type=int, default=32, help="tokens per answer of the fill runs")
    parser.add_argument("--skip-fill", action="store_true", help="served runs only")
    parser.add_argument("--data", default=None, help="a folder of <Subset>.jsonl (default: the carried sample)")
    parser.add_argument("--output", default="build/bench/grammar_backends.json")
    parser.set_defaults(func=main)


def _csv_int(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def fresh_specs(specs: list[RequestSpec], backend: str, tag: str) -> list[RequestSpec]:
    """`specs` for `backend`, each schema with a title no other request has (`tag` names the run
    and the turn): a distinct text, so no compile cache holds it. The prompt is left as it was."""
    fresh = []
    for i, spec in enumerate(specs):
        schema = {**spec.schema, "title": f"{tag} {backend} {i}"}
        fresh.append(replace(spec, request_id=f"{spec.request_id}@{backend}{i}", schema=schema, check_schema=schema,
                             grammar_backend=backend))
    return fresh


def turn_order(backends: tuple[str, ...], round_index: int) -> list[str]:
    """The backends in round `round_index`, rotated so that each goes first as often as the others."""
    shift = round_index % len(backends)
    return list(backends[shift:] + backends[:shift])


def served_summary(records: list[RequestRecord], wall_s: float, specs: dict[str, RequestSpec]) -> dict:
    """One backend's figures at one concurrency, over all its turns (wall_s: their walls added)."""
    summary = report.summarize(records, wall_s)
    summary.update(serve_workloads.score_records(specs, records))
    chosen: dict[str, int] = {}
    for record in records:
        if record.ok:
            chosen[record.grammar_backend] = chosen.get(record.grammar_backend, 0) + 1
    summary["served_by"] = dict(sorted(chosen.items()))
    return summary


def fill_summary(timings: list[StepTiming], num_rows: int = FILL_BATCH) -> dict:
    """Over the steps that filled `num_rows` bitmask rows: the fill's and the forward's median and
    p99 (ms), and the steps whose fill outlasted the forward beside it."""
    full = [t for t in timings if t.num_bitmask_rows == num_rows]
    fill_ms = [1e3 * t.fill_s for t in full]
    forward_ms = [1e3 * t.forward_s for t in full]
    return {"num_steps": len(full),
            "fill_ms_p50": statistics.median(fill_ms) if full else None,
            "fill_ms_p99": report.percentile(fill_ms, 99),
            "forward_ms_p50": statistics.median(forward_ms) if full else None,
            "total_ms_p50": statistics.median(1e3 * t.total_s for t in full) if full else None,
            "num_fill_over_forward": sum(t.fill_s > t.forward_s for t in full)}


async def _served(address: str, args: argparse.Namespace, tag: str) -> list[dict]:
    client = Client(address, rpc_timeout_s=600.0)
    try:
        pool = await _compiling_specs(client, serve_workloads.mixed_schemas(args.max_tokens, data=args.data), tag)
        per_turn = {c: max(c, args.requests) for c in args.concurrency}
        needed = max(per_turn.values()) * args.rounds
        if len(pool) < needed:
            raise ValueError(f"{len(pool)} schemas compile; {needed} needed for distinct schemas in every turn")
        prompts = [replace(s, schema=None, max_tokens=1) for s in pool[:needed]]
        log(f"prefix-cache warm-up: {len(prompts)} prompts, one token each")
        await run_load(client, prompts, LoadShape(concurrency=16, max_requests=len(prompts)))
        rows = []
        for concurrency in args.concurrency:
            n = per_turn[concurrency]
            records: dict[str, list[RequestRecord]] = {b: [] for b in BACKENDS}
            walls = dict.fromkeys(BACKENDS, 0.0)
            specs: dict[str, RequestSpec] = {}
            for r in range(args.rounds):
                for backend in turn_order(BACKENDS, r):
                    turn = fresh_specs(pool[r * n:(r + 1) * n], backend, f"{tag} c{concurrency} r{r}")
                    specs.update((s.request_id, s) for s in turn)
                    result = await run_load(client, turn, LoadShape(concurrency=concurrency, max_requests=len(turn)))
                    records[backend] += result.records
                    walls[backend] += result.wall_s
                    log(f"c={concurrency} round {r} {backend}: {len(turn)} requests in {result.wall_s:.1f} s")
            for backend in BACKENDS:
                row = served_summary(records[backend], walls[backend], specs)
                rows.append({"backend": backend, "concurrency": concurrency, **row})
        return rows
    finally:
        await client.close()


async def _compiling_specs(client: Client, specs: list[RequestSpec], tag: str) -> list[RequestSpec]:
    """The specs whose schema compiles in strict mode (a probe with its own title, so the
    measured requests still miss), jump-forward on, speculation off: mode constrained+jf."""
    kept = []
    for spec in specs:
        response = await client.validate({**spec.schema, "title": f"{tag} probe"})
        if response.ok:
            kept.append(replace(spec, jump_forward=True, speculative=False))
    log(f"{len(kept)} of {len(specs)} schemas compile in strict mode")
    return kept


def _fill(args: argparse.Namespace, tag: str) -> list[dict]:
    """The batch-64 fill per backend, in this process, with the server's engine options: twice 64
    requests, so that the engine keeps 64 running while the first ones finish. Their grammars are
    compiled first (each schema text new, never filled), so that the batch starts full; closing
    early is off, so that max_tokens cuts the answers where it falls rather than every step
    closing them."""
    from engine.args import add_engine_args, engine_config_from_args
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams
    from grammar.constraint import Constraint

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    engine_args, _ = parser.parse_known_args(SERVER_ARGS)  # the serve-only options aside
    llm = LLM(config=engine_config_from_args(engine_args))
    try:
        pool = serve_workloads.mixed_schemas(args.fill_max_tokens, data=args.data)
        pool = [s for s in pool if _compiles(llm, Constraint(kind="json_schema", spec=json.dumps(s.schema)))]
        batch = [pool[i % len(pool)] for i in range(2 * FILL_BATCH)]
        prompts = [s.messages for s in batch]
        llm.generate(prompts, SamplingParams(max_tokens=1))  # the prefix cache, as the server's
        rows = []
        for backend in BACKENDS:
            constraints = [Constraint(kind="json_schema", spec=json.dumps(s.schema), jump_forward=True,
                                      close_early=False, grammar_backend=backend)
                           for s in fresh_specs(batch, backend, f"{tag} fill")]
            started = time.perf_counter()
            num_compiled = sum(_compiles(llm, c) for c in constraints)
            compile_s = time.perf_counter() - started
            params = [SamplingParams(temperature=0, max_tokens=args.fill_max_tokens, speculative=False, constraint=c)
                      for c in constraints]
            llm.engine.step_stats.take_timings()  # the steps before this run
            started = time.perf_counter()
            outputs = llm.generate(prompts, params)
            seconds = time.perf_counter() - started
            row = {"backend": backend, "seconds": seconds, "compile_s": compile_s, "num_compiled": num_compiled,
                   **fill_summary(llm.engine.step_stats.take_timings()),
                   "num_output_tokens": sum(o.num_output_tokens for o in outputs)}
            log(f"fill {backend}: {row['num_steps']} steps with {FILL_BATCH} rows, fill p50 {_fmt(row['fill_ms_p50'])} "
                f"ms, forward p50 {_fmt(row['forward_ms_p50'])} ms ({num_compiled} compiled in {compile_s:.1f} s)")
            rows.append(row)
        return rows
    finally:
        llm.shutdown()


def _compiles(llm: LLM, constraint: Constraint) -> bool:
    """It compiles (and is in the engine's compile cache from now on)."""
    return llm.engine.validate_constraint(constraint).ok


def _fmt(value: float | None, digits: int = 1, scale: float = 1.0) -> str:
    return "–" if value is None else f"{value * scale:,.{digits}f}"


def served_table(rows: list[dict]) -> str:
    lines = ["| backend | load | TTFT p50 / p99 (s) | grammar wait p50 / p99 (ms) | out tok/s | ITL p50 / p99 (ms) | "
             "valid | served by |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        served = ", ".join(f"{name or 'none'} {n}" for name, n in r["served_by"].items())
        lines.append(f"| {r['backend']} | c={r['concurrency']} | "
                     f"{_fmt(r['ttft_s_p50'], 2)} / {_fmt(r['ttft_s_p99'], 2)} | "
                     f"{_fmt(r['grammar_wait_s_p50'], 0, 1e3)} / {_fmt(r['grammar_wait_s_p99'], 0, 1e3)} | "
                     f"{_fmt(r['output_token_throughput'])} | {_fmt(r['itl_s_p50'], 0, 1e3)} / "
                     f"{_fmt(r['itl_s_p99'], 0, 1e3)} | {r['num_valid']}/{r['num_requests']} | {served} |")
    return "\n".join(lines)


def fill_table(rows: list[dict]) -> str:
    lines = [f"| backend | steps with {FILL_BATCH} rows | fill p50 / p99 (ms) | forward p50 (ms) | step p50 (ms) | "
             "fill over the forward |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['backend']} | {r['num_steps']} | "
                     f"{_fmt(r['fill_ms_p50'], 2)} / {_fmt(r['fill_ms_p99'], 2)} | "
                     f"{_fmt(r['forward_ms_p50'])} | {_fmt(r['total_ms_p50'])} | "
                     f"{r['num_fill_over_forward']} of {r['num_steps']} |")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from bench.server_process import ServerProcess

    tag = f"formwork-bench {uuid.uuid4().hex[:8]}"  # a second run against the same server misses too
    result: dict = {"meta": {**machine(), "server_args": None if args.address else SERVER_ARGS,
                             "max_tokens": args.max_tokens, "load_average_start": list(_loadavg())}}
    if args.address:
        result["served"] = asyncio.run(_served(args.address, args, tag))
    else:
        log(f"starting formwork serve {' '.join(SERVER_ARGS)}")
        with ServerProcess(SERVER_ARGS) as server:
            result["served"] = asyncio.run(_served(server.address, args, tag))
    result["meta"]["load_average_after_served"] = list(_loadavg())
    if not args.skip_fill:
        result["fill"] = _fill(args, tag)
        result["meta"]["load_average_end"] = list(_loadavg())
    out = Path(args.output)
    report.write_json(out, result)
    print(served_table(result["served"]))
    if "fill" in result:
        print()
        print(fill_table(result["fill"]))
    print(f"load average: start {_loads(result['meta']['load_average_start'])}, after the served runs "
          f"{_loads(result['meta']['load_average_after_served'])}"
          + (f", end {_loads(result['meta']['load_average_end'])}" if "fill" in result else ""))
    print(f"results: {out}")
    return 0


def _loadavg() -> tuple[float, float, float]:
    return os.getloadavg()


def _loads(values: list[float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values)
