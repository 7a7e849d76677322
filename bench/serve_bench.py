"""`formwork bench serve`: load a running (or freshly started) server over gRPC, run the peers on
the same prompts, and write one JSON result file plus PNG plots.

    formwork bench serve --smoke                    # a minute or two; non-zero exit on bad numbers
    formwork bench serve --full --peers transformers,llama-cpp,vllm --output-dir build/bench
    formwork bench serve --address 127.0.0.1:50051 --workload mixed-schemas --rate 2 --num-requests 40

Formwork modes: `unconstrained` (the json-extraction prompts, no constraint), `constrained`
(jump-forward off), `constrained+jf` (jump-forward on, the server's default) and `constrained+jf+spec`
(jump-forward and speculative decoding from the prompt: greedy, so the answers are the same as
constrained+jf's; its runs report the draft acceptance rate). Grammars are
compiled ahead of the measured load (ValidateConstraint; its compile times are reported), so
the runs measure steady serving; the new-schema burst (`--burst`) measures what compiling costs
the requests already running.
"""
from __future__ import annotations

import asyncio
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from bench import report, serve_workloads
from bench.burst import burst_test
from bench.peer_requests import VLLM_TOOL_PARSERS, peer_payload_requests
from bench.request_record import RequestRecord
from bench.serve import Client, LoadShape, RequestSpec, compile_all, log, run_load
from bench.serve_goals import goals, smoke_checks
from engine.config import EngineConfig

if TYPE_CHECKING:
    from bench.http_client import HttpClient

FULL_CONCURRENCY = (1, 8, 32, 64)
# mode -> (constrained, jump_forward, speculative)
# unconstrained-matched: no constraint, EOS ignored, each answer exactly as long as the `constrained`
# answer to the same item at the same load: the same tokens and context lengths, so the ratio is the
# price of the grammar alone (plain `unconstrained` answers run on to max_tokens, which slows steps)
# (speculation, the server's default, is a mode of its own: the others say False)
MODES = {"unconstrained": (False, None, False), "constrained": (True, False, False),
         "unconstrained-matched": (False, None, False), "constrained+jf": (True, True, False),
         "constrained+jf+spec": (True, True, True)}
SERVER_ARGS = ["--max-num-seqs", "64", "--max-model-len", "2048", "--kv-cache-gib", "3", "--threads", "2",
               "--max-tokens-cap", "512"]
SMOKE_SERVER_ARGS = ["--max-num-seqs", "8", "--max-model-len", "1024", "--kv-cache-gib", "0.5", "--threads", "2",
                     "--max-tokens-cap", "256"]
# json-extraction items whose greedy answers end well within 256 tokens: SmolLM2-135M loops inside
# some schemas' arrays and strings until max_tokens, and the smoke check asks for 100% valid outputs
SMOKE_ITEMS = ("people-02", "invoice-02", "event-03", "ticket-01", "flight-01", "appt-01", "property-01",
               "weather-01")
# what the started server's "auto" dtype resolves to here: the peers run it too, the roofline counts it
SERVED_DTYPE = EngineConfig().torch_dtype
SERVED_WEIGHT_DTYPE = EngineConfig().cpu_weight_torch_dtype or SERVED_DTYPE  # what a decode step reads
PEER_TIMEOUT_S = {"transformers": 2400.0, "llama-cpp": 1800.0, "vllm": 2400.0, "vllm-compiled": 2400.0,
                  "vllm-ngram": 2400.0, "vllm-http": 2400.0}


def _num_requests(concurrency: int, cap: int) -> int:
    """One request per worker (one static batch for transformers), at least 4; the same count
    for Formwork and every peer, so that tail effects weigh the same."""
    return min(max(concurrency, 4), cap)


def _cdf_lists(records: list[RequestRecord]) -> dict:
    ok = [r for r in records if r.ok]
    return {"itl_s": [round(g, 5) for r in ok for g in r.itl_s], "e2e_s": [round(r.e2e_s, 4) for r in ok],
            "ttft_s": [round(r.ttft_s, 4) for r in ok]}


def summarize_run(records: list[RequestRecord], wall_s: float, specs: dict[str, RequestSpec], **labels) -> dict:
    summary = report.summarize(records, wall_s, **labels)
    summary.update(serve_workloads.score_records(specs, records))
    summary["cdf"] = _cdf_lists(records)
    return summary


def _only(specs: list[RequestSpec], items: list[str] | None) -> list[RequestSpec]:
    if not items:
        return specs
    kept = [s for s in specs if s.request_id in items]
    if len(kept) != len(set(items)):
        raise ValueError(f"unknown item ids: {sorted(set(items) - {s.request_id for s in kept})}")
    return kept


async def formwork_runs(client: Client, workload: str, modes: list[str], shapes: list[LoadShape],
                        max_tokens: int, unconstrained_max_tokens: int | None = None,
                        items: list[str] | None = None, data: str | None = None,
                        http_client: HttpClient | None = None,
                        tool_choice: str = "required") -> tuple[list[dict], dict]:
    """Each mode at each load over gRPC (system "formwork") and, with `http_client`, right after
    it the same requests over the OpenAI-compatible HTTP API (system "formwork-http")."""
    runs, compile_stats = [], {}
    # every prompt once (one token, no constraint) first: each mode then meets the same warm
    # prefix cache, whichever runs first (vLLM's peer warms the same way; transformers has none)
    prompts = _only(serve_workloads.build(workload, 1, constrained=False, data=data), items)
    log(f"prefix-cache warm-up: {len(prompts)} prompts, one token each")
    await run_load(client, prompts, LoadShape(concurrency=16, max_requests=len(prompts)))
    specs_by_mode = {}
    for mode in modes:
        constrained, jump_forward, speculative = MODES[mode]
        limit = max_tokens if constrained else (unconstrained_max_tokens or max_tokens)
        specs = _only(serve_workloads.build(workload, limit, constrained, jump_forward, data, tool_choice), items)
        if speculative is not None:
            specs = [replace(s, speculative=speculative) for s in specs]
        specs_by_mode[mode], stats = await compile_all(client, specs)
        if stats["num_compiled"]:
            compile_stats[workload] = stats
        if constrained and specs and specs[0].tools:
            # the tools' grammar is compiled by a first request (ValidateConstraint takes no tools),
            # here rather than in the first measured one; the peers warm theirs the same way
            await run_load(client, [replace(specs[0], max_tokens=1)], LoadShape(concurrency=1, max_requests=1))
    # modes back to back at each load, so that a change in the machine's other load between
    # them (it is shared) weighs on their ratio as little as it can
    for shape in shapes:
        lengths: dict[str, int] = {}  # item id -> output tokens of its constrained answer at this load
        for mode in modes:
            specs = specs_by_mode[mode]
            if mode == "unconstrained-matched":
                if not lengths:
                    raise ValueError("mode unconstrained-matched needs mode constrained before it")
                specs = [replace(s, max_tokens=lengths[s.request_id], ignore_eos=True) for s in specs
                         if s.request_id in lengths]
            for system, via in (("formwork", client), ("formwork-http", http_client)):
                if via is None:
                    continue
                log(f"{system} {mode} ({workload}) {shape.label}, {shape.max_requests} requests")
                result = await run_load(via, specs, shape)
                summary = summarize_run(result.records, result.wall_s, {s.request_id: s for s in specs},
                                        system=system, mode=mode, workload=workload, concurrency=shape.concurrency,
                                        rate=shape.rate, stopped_by_time=result.stopped_by_time,
                                        **_tool_label(specs))
                log(f"  {summary['output_token_throughput']:.1f} out tok/s, valid {summary['num_valid']}/"
                    f"{summary['num_requests']}, errors {summary['num_errors']}")
                _log_calls(summary)
                if summary["draft_acceptance_rate"] is not None:
                    log(f"  drafts: {summary['draft_tokens']} tokens, {summary['draft_acceptance_rate']:.0%} accepted, "
                        f"{summary['forward_passes_per_output_token']:.2f} forward passes per output token")
                runs.append(summary)
            if mode == "constrained":
                for record in result.records:
                    if record.ok:
                        lengths.setdefault(record.request_id.rsplit("#", 1)[0], max(record.num_output_tokens, 1))
    return runs, compile_stats


def _tool_label(specs: list[RequestSpec]) -> dict:
    return {"tool_choice": specs[0].tool_choice} if specs and specs[0].tools else {}


def _log_calls(summary: dict) -> None:
    if calls := summary.get("tool_calls"):
        log(f"  calls: {calls['num_calls_schema_valid']}/{calls['num_calls']} valid against their schemas, "
            f"per answer {calls['calls_per_answer']}, {summary['num_length_capped']} cut by max_tokens")


async def peer_runs(client: Client, names: list[str], concurrencies: list[int], max_tokens: int, cap: int,
                    model_dir: str, workload: str = "json-extraction", num_requests: int | None = None,
                    tool_choice: str = "required") -> tuple[list[dict], dict]:
    """Each peer at each concurrency on the constrained requests of tool-calls, or else of
    json-extraction, as many per run as Formwork's runs send."""
    from bench.peers import PEERS, PeerSkipped, records_from_peer, run_peer
    from engine.model_files import default_gguf_path

    workload = workload if workload == "tool-calls" else "json-extraction"
    specs = serve_workloads.build(workload, max_tokens, tool_choice=tool_choice)
    by_id = {s.request_id: s for s in specs}
    syntax = (await client.model_info()).tool_call_syntax or "hermes"
    runs, status = [], {}
    for name in names:
        peer = PEERS[name]
        if workload == "tool-calls" and not peer.tools:
            status[name] = {"status": "skipped", "reason": "this peer does not answer tool-call requests"}
            log(f"peer {name}: skipped (no tool calls)")
            continue
        if workload == "tool-calls" and name.startswith("vllm") and not VLLM_TOOL_PARSERS.get(syntax, syntax):
            status[name] = {"status": "skipped", "reason": f"vLLM has no tool-call parser for the {syntax} syntax"}
            log(f"peer {name}: skipped (no parser for {syntax})")
            continue
        levels = [1] if name == "llama-cpp" else concurrencies  # one sequence at a time
        payload_runs = []
        for c in levels:
            n = (num_requests or _num_requests(c, cap)) if name != "llama-cpp" else min(16, cap)
            payload_runs.append({"name": f"constrained c={c}", "concurrency": c,
                                 "requests": await peer_payload_requests(client, specs, n, syntax)})
        try:
            gguf = str(default_gguf_path())
        except ValueError:
            gguf = ""
        payload = {"model_dir": model_dir, "gguf": gguf, "threads": 1 if name == "llama-cpp" else 2,
                   "dtype": SERVED_DTYPE, "runs": payload_runs}
        if workload == "tool-calls":
            payload["tool_call_parser"] = VLLM_TOOL_PARSERS.get(syntax, syntax)
        log(f"peer {name}: {len(payload_runs)} runs ({peer.note})")
        started = time.monotonic()
        try:
            result = await asyncio.to_thread(run_peer, peer, payload, PEER_TIMEOUT_S[name])
        except PeerSkipped as e:
            status[name] = {"status": "skipped", "reason": str(e)}
            log(f"  skipped: {e}")
            continue
        except RuntimeError as e:
            status[name] = {"status": "failed", "reason": str(e)[-2000:]}
            log(f"  failed: {str(e)[-600:]}")
            continue
        status[name] = {"status": "ran", "version": result.get("version"), "load_s": result.get("load_s"),
                        "notes": result.get("notes", []) + [peer.note], "elapsed_s": time.monotonic() - started}
        for run in result["runs"]:
            records = records_from_peer(run)
            summary = summarize_run(records, run["wall_s"], by_id, system=name, mode="constrained",
                                    workload=workload, concurrency=run["concurrency"], rate=None, **_tool_label(specs))
            log(f"  {run['name']}: {summary['output_token_throughput']:.1f} out tok/s, valid "
                 f"{summary['num_valid']}/{summary['num_requests']}")
            _log_calls(summary)
            runs.append(summary)
    return runs, status


def machine() -> dict:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        commit = ""
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"), "cpu": cpu, "cores": os.cpu_count(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "load_average": os.getloadavg(), "python": platform.python_version(), "commit": commit}


async def _main_async(args, server_address: str, model_dir: str, http_url: str | None = None) -> dict:
    client = Client(server_address, rpc_timeout_s=args.rpc_timeout)
    http_client = None
    if http_url:
        from bench.http_client import HttpClient  # httpx: only for --protocol http
        http_client = HttpClient(http_url, client, rpc_timeout_s=args.rpc_timeout)
    try:
        info = await client.model_info()
        result: dict = {"meta": {**machine(), "server": server_address, "model": info.model_name,
                                 "max_tokens": args.max_tokens, "server_args": args.server_args_used},
                        "runs": []}
        if args.rate:
            shapes = [LoadShape(rate=args.rate, max_requests=args.num_requests or 32, max_duration_s=args.duration)]
        else:
            shapes = [LoadShape(concurrency=c, max_requests=args.num_requests or _num_requests(c, args.max_requests),
                                max_duration_s=args.duration) for c in args.concurrency]
        modes = ["unconstrained"] if args.workload == "unconstrained" else args.modes
        workload = "json-extraction" if args.workload == "unconstrained" else args.workload
        runs, compile_stats = await formwork_runs(client, workload, modes, shapes, args.max_tokens,
                                                  64 if args.smoke else None, args.items, args.data, http_client,
                                                  args.tool_choice)
        result["runs"] += runs
        result["grammar_compile"] = compile_stats
        if args.peers:
            peer_runs_, status = await peer_runs(client, args.peers, args.concurrency, args.max_tokens,
                                                 args.max_requests, model_dir, workload, args.num_requests,
                                                 args.tool_choice)
            result["runs"] += peer_runs_
            result["peers"] = status
            if not args.rate and any(v["status"] == "ran" for v in status.values()):
                # Formwork's headline load again, right after the peers: the machine is shared, and
                # this bracket shows how far its other load drifted while the peers ran
                top = max(args.concurrency)
                after, _ = await formwork_runs(client, workload, ["constrained+jf"], [
                    LoadShape(concurrency=top, max_requests=args.num_requests or _num_requests(top, args.max_requests),
                              max_duration_s=args.duration)], args.max_tokens, items=args.items,
                                                 data=args.data, tool_choice=args.tool_choice)
                for run in after:
                    run["mode"] = "constrained+jf (after peers)"
                result["runs"] += after
        if args.roofline:
            from bench.roofline import roofline
            unconstrained = [r for r in result["runs"] if r["system"] == "formwork" and r["mode"] == "unconstrained"
                             and r.get("concurrency")]
            result["roofline"] = roofline(Path(model_dir), unconstrained, SERVED_WEIGHT_DTYPE)
        if args.burst:
            result["burst"] = await burst_test(client)
        result["goals"] = goals(result["runs"], result.get("burst"))
        return result
    finally:
        if http_client is not None:
            await http_client.close()
        await client.close()


def server_args(args) -> list[str]:
    """The command line of the server started here."""
    return ((SMOKE_SERVER_ARGS if args.smoke else SERVER_ARGS) + (["--model", args.model] if args.model else [])
            + (["--tool-call-syntax", args.tool_call_syntax] if args.tool_call_syntax else []))


def main(args) -> int:
    from bench.server_process import ServerProcess
    from engine.model_files import resolve_model

    if args.smoke:
        args.concurrency, args.modes = [4], ["unconstrained", "constrained+jf"]
        args.items = args.items or list(SMOKE_ITEMS)
        args.num_requests = args.num_requests or 8
    if args.full:
        args.concurrency, args.modes, args.roofline, args.burst = list(FULL_CONCURRENCY), list(MODES), True, True
    if args.speculative:
        args.modes = [m for m in args.modes if m != "constrained+jf+spec"]
        args.modes.insert(args.modes.index("constrained+jf") + 1 if "constrained+jf" in args.modes else len(args.modes),
                          "constrained+jf+spec")
    model_dir = str(resolve_model(args.model))
    server = None
    http_url = None
    if args.address:
        if args.tool_call_syntax:
            log("--tool-call-syntax is for the server started here; start the one at --address with it")
            return 2
        address = args.address
        args.server_args_used = None
        if args.protocol == "http":
            if not args.http_address:
                log("--protocol http with --address needs --http-address HOST:PORT")
                return 2
            http_url = f"http://{args.http_address}"
    else:
        args.server_args_used = server_args(args)
        log(f"starting formwork serve {' '.join(args.server_args_used)}")
        server = ServerProcess(args.server_args_used, http=args.protocol == "http")
        address, http_url = server.address, server.http_url
        log(f"server ready on {address}" + (f" and {http_url}" if http_url else ""))
    try:
        result = asyncio.run(_main_async(args, address, model_dir, http_url))
    finally:
        if server is not None:
            server.stop()
    out = Path(args.output)
    report.write_json(out, result)
    plots = report.plot_all(result, Path(args.plots_dir)) if args.plots_dir else []
    summary_runs = [{k: v for k, v in r.items() if k != "cdf"} for r in result["runs"]]
    problems = smoke_checks(result) if args.smoke else []
    if args.json:
        print(json.dumps({"output": str(out), "plots": [str(p) for p in plots], "runs": summary_runs,
                          "grammar_compile": result.get("grammar_compile"), "roofline": result.get("roofline"),
                          "burst": result.get("burst"), "peers": result.get("peers"), "goals": result.get("goals"),
                          "problems": problems}, default=str))
    else:
        print(report.run_table(result["runs"]))
        if tools := report.tool_call_table(result["runs"]):
            print(tools)
        for name, goal in result.get("goals", {}).items():
            print(f"{name}: {goal}")
        print(f"results: {out}" + (f"; plots: {', '.join(str(p) for p in plots)}" if plots else ""))
    for problem in problems:
        print(f"bench serve --smoke: {problem}", file=sys.stderr)
    return 1 if problems else 0
