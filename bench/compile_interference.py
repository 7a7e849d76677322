"""`formwork bench compile-interference`: what one heavy schema's compile costs the requests beside it.

A probe (a small greedy generation without a constraint) is timed alone and while a compile bomb
compiles (sent with ValidateConstraint, which compiles and generates nothing; the probe starts
`--overlap-delay` after it), alternating which comes first in each round so that the machine's
drifting load cancels out in the paired ratio (probe during / probe alone). Each bomb is made
unique per round (its title), so every send is a real compile. Per server, grammar backend and
bomb: the probe's median and max alone and during the compile, the median paired slowdown, and
the bomb's own compile latency (ValidateConstraint's wall time and its compile_s).

With `--compare-normal` a second server runs with --no-idle-compiles and the rounds alternate
between the two, so the idle-class compile and the normal-priority one are measured in one run;
`--compare-args=--no-schema-worker` does the same for any server option.
"""
from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

# name -> the bomb's constraint (proto Constraint fields), unique per round; the others are the fuzz
# suite's slowest (tests/support/fuzz_requests.py): two regexes whose xgrammar fills take seconds, one
# whose counts xgrammar expands for 0.5 s before refusing, and a schema with no finite instance, which
# llguidance takes 0.9 s to find has no shortest output (xgrammar then refuses it)
BOMBS = {
    "object of 1,000 required properties": lambda i: {"json_schema_text": json.dumps({
        "title": f"bomb {i}", "type": "object",
        "properties": {f"field_{n:04d}": {"type": "integer"} for n in range(1000)},
        "required": [f"field_{n:04d}" for n in range(1000)]})},
    "nested anyOf, 2^10 branches": lambda i: {"json_schema_text": json.dumps({"title": f"bomb {i}",
                                                                              **_nested_any_of(10)})},
    "regex (\\w+ ?){1,50}": lambda i: {"regex": f"(bomb{i} )?" + r"(\w+ ?){1,50}"},
    "regex ([a-z]{1,3}){0,1000}": lambda i: {"regex": f"(bomb{i} )?" + "([a-z]{1,3}){0,1000}"},
    "regex (a{1000}){1000}": lambda i: {"regex": f"(bomb{i} )?" + "(a{1000}){1000}"},
    "schema with a required child of its own shape": lambda i: {"json_schema_text": json.dumps({
        "title": f"bomb {i}", "type": "object", "properties": {"child": {"$ref": "#"}, "n": {"type": "integer"}},
        "required": ["child"]})},
}


def _nested_any_of(depth: int) -> dict:
    """Two objects at each level, each holding the next level: 2**depth paths to a leaf."""
    if depth == 0:
        return {"type": "integer"}
    inner = _nested_any_of(depth - 1)
    return {"anyOf": [{"type": "object", "properties": {"left": inner}, "required": ["left"]},
                      {"type": "object", "properties": {"right": inner}, "required": ["right"]}]}


def add_parser(which) -> None:
    parser = which.add_parser("compile-interference",
                              help="a small probe's latency alone and while a heavy schema compiles, per backend")
    parser.add_argument("--rounds", type=int, default=5, help="probe pairs per row (median)")
    parser.add_argument("--probe-tokens", type=int, default=16)
    parser.add_argument("--backends", default="auto,xgrammar,llguidance")
    parser.add_argument("--only", help="comma list: only the bombs whose name contains one of these")
    parser.add_argument("--overlap-delay", type=float, default=0.05,
                        help="seconds between sending the bomb and starting the probe")
    parser.add_argument("--compare-normal", action="store_true",
                        help="also a server with --no-idle-compiles, rounds alternated with the default one")
    parser.add_argument("--compare-args", help="also a server started with these arguments (e.g. "
                        "--compare-args=--no-schema-worker), rounds alternated with the default one")
    parser.add_argument("--output", default="build/bench/compile_interference.json")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    import grpc
    from google.protobuf import json_format

    from bench.server_process import ServerProcess
    from service._gen.formwork.v1 import generation_pb2 as pb
    from service._gen.formwork.v1 import generation_pb2_grpc as pb_grpc

    common = ["--max-model-len", "512", "--num-blocks", "256", "--max-tokens-cap", "256", "--threads", "2"]
    labels = {"idle compiles": common}
    if args.compare_normal:
        labels["normal-priority compiles"] = [*common, "--no-idle-compiles"]
    if args.compare_args:
        labels[args.compare_args.strip()] = [*common, *args.compare_args.split()]
    servers: dict[str, ServerProcess] = {}
    channels = []
    try:
        stubs = {}
        for label, server_args in labels.items():
            servers[label] = ServerProcess(server_args)
            channel = grpc.insecure_channel(servers[label].address)
            channels.append(channel)
            stubs[label] = pb_grpc.GenerationStub(channel)
        probe = pb.GenerateRequest(prompt="Once upon a time", max_tokens=args.probe_tokens, temperature=0,
                                   ignore_eos=True)
        bombs = {name: make for name, make in BOMBS.items()
                 if not args.only or any(part in name for part in args.only.split(","))}
        backends = [b.strip() for b in args.backends.split(",") if b.strip()]

        def timed_probe(stub) -> float:
            start = time.perf_counter()
            stub.Generate(probe, timeout=300)
            return time.perf_counter() - start

        def compile_beside_probe(stub, bomb: dict, backend: str) -> tuple[float, dict]:
            """(the probe's latency, the bomb's outcome) with the bomb compiling as the probe starts."""
            constraint = json_format.ParseDict({**bomb, "grammar_backend": f"GRAMMAR_BACKEND_{backend.upper()}"},
                                               pb.Constraint())
            outcome: dict = {}

            def validate() -> None:
                start = time.perf_counter()
                report = stub.ValidateConstraint(pb.ValidateConstraintRequest(constraint=constraint), timeout=600)
                outcome.update(wall_s=time.perf_counter() - start, compile_s=report.compile_s, ok=report.ok,
                               backend=pb.GrammarBackend.Name(report.grammar_backend), error=report.error[:120])
            thread = threading.Thread(target=validate)
            thread.start()
            time.sleep(args.overlap_delay)
            latency = timed_probe(stub)
            thread.join()
            return latency, outcome

        for stub in stubs.values():  # warm-up: the compile paths, the allocator, a first probe
            for backend in backends:
                compile_beside_probe(stub, {"json_schema_text": json.dumps({"type": "object", "title": backend})},
                                     backend)
        rows: dict[tuple[str, str, str], dict] = {}
        for round_index in range(args.rounds):
            for name, make in bombs.items():
                for backend in backends:
                    for label, stub in stubs.items():
                        row = rows.setdefault((label, backend, name), {"alone": [], "during": [], "ratio": [],
                                                                      "outcomes": []})
                        alone_first = round_index % 2 == 0
                        alone = timed_probe(stub) if alone_first else 0.0
                        during, outcome = compile_beside_probe(
                            stub, make(f"{label}/{backend}/{round_index}"), backend)
                        if not alone_first:
                            alone = timed_probe(stub)
                        row["alone"].append(alone)
                        row["during"].append(during)
                        row["ratio"].append(during / alone)
                        row["outcomes"].append(outcome)
                        print(f"round {round_index} {label} {backend} {name}: alone {alone:.3f} s, during "
                              f"{during:.3f} s, compile {outcome['wall_s']:.2f} s on {outcome['backend']}"
                              f"{'' if outcome['ok'] else ' refused: ' + outcome['error']}", flush=True)
    finally:
        for channel in channels:
            channel.close()
        for server in servers.values():
            server.stop()
    result = summarize(rows, args)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    return 0


def summarize(rows: dict[tuple[str, str, str], dict], args: argparse.Namespace) -> dict:
    out = {"rounds": args.rounds, "probe_tokens": args.probe_tokens, "rows": []}
    for (label, backend, bomb), row in rows.items():
        outcomes = row["outcomes"]
        out["rows"].append({
            "server": label, "backend": backend, "bomb": bomb,
            "served_by": sorted({o["backend"] for o in outcomes}), "ok": all(o["ok"] for o in outcomes),
            "compile_wall_s": statistics.median(o["wall_s"] for o in outcomes),
            "compile_s": statistics.median(o["compile_s"] for o in outcomes),
            "alone_p50_s": statistics.median(row["alone"]), "alone_max_s": max(row["alone"]),
            "during_p50_s": statistics.median(row["during"]), "during_max_s": max(row["during"]),
            "slowdown": statistics.median(row["ratio"]) - 1,
            "median_moved": statistics.median(row["during"]) / statistics.median(row["alone"]) - 1})
    return out


def table(result: dict) -> str:
    lines = [f"probe: {result['probe_tokens']} tokens, {result['rounds']} rounds", "",
             "| server | backend | bomb | compiled by | compile wall / compile_s (s) | probe alone p50 / max (s) | "
             "during p50 / max (s) | probe median moved | paired slowdown (median) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        served = ",".join(n.replace("GRAMMAR_BACKEND_", "").lower() for n in row["served_by"])
        lines.append(
            f"| {row['server']} | {row['backend']} | {row['bomb']} | {served}{'' if row['ok'] else ' (refused)'} | "
            f"{row['compile_wall_s']:.2f} / {row['compile_s']:.2f} | {row['alone_p50_s']:.3f} / "
            f"{row['alone_max_s']:.3f} | {row['during_p50_s']:.3f} / {row['during_max_s']:.3f} | "
            f"{row['median_moved'] * 100:+.1f}% | {row['slowdown'] * 100:+.1f}% |")
    return "\n".join(lines)
