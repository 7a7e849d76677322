"""`formwork bench bombs`: what a grammar bomb costs the requests beside it.

For each bomb (a constraint built to exhaust the grammar engine), a probe request (a fixed
unconstrained generation) runs while the bomb is sent, and its latency is compared with the
probe's baseline. Bombs are refused at compile time, so they should cost the probe nothing; the
constraints that are accepted but heavy generate beside the probe, so they are compared with a
benign constrained companion too (two requests in a batch cost a little more than one, whatever
their grammars). Each probe beside a bomb is paired with the probe alone right before or after it (alternating),
and the slowdown is the median of those ratios, so a machine's drifting load cancels out;
each bomb is made unique per round, so every send is a real compile rather than a cache hit.
Writes JSON and prints the markdown table of docs/reliability.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

RECURSIVE = {"type": "object", "properties": {"child": {"$ref": "#"}, "n": {"type": "integer"}}, "required": ["child"]}

# name -> (constraint as a function of the round, so each send is a fresh compile)
BOMBS = {
    "regex a{99999999999}": lambda i: {"regex": f"a{{99999999999}}|x{{{i}}}"},
    "regex (a{1000}){1000}": lambda i: {"regex": f"(a{{1000}}){{1000}}|x{{{i}}}"},
    "schema pattern (a{1000}){1000}": lambda i: {"json_schema_text": json.dumps(
        {"type": "string", "pattern": "(a{1000}){1000}", "title": str(i)})},
    "recursive required schema": lambda i: {"json_schema_text": json.dumps({**RECURSIVE, "title": str(i)})},
    "schema minItems 1e6 of a const": lambda i: {"json_schema_text": json.dumps(
        {"type": "array", "items": {"const": "x"}, "minItems": 1000000, "title": str(i)})},
    'EBNF root ::= "a" root': lambda i: {"grammar": f'root ::= "a" root\nunused ::= "{i}"'},
    "regex [a-z]{0,99999999}": lambda i: {"regex": f"[a-z]{{0,99999999}}|x{{{i}}}"},
    "regex (\\w+ ?){1,50} (ambiguous: slow fills)": lambda i: {"regex": f"(\\w+ ?){{1,50}}|x{{{i}}}"},
    "regex ([a-z]{1,3}){0,1000}": lambda i: {"regex": f"([a-z]{{1,3}}){{0,1000}}|x{{{i}}}"},
    "regex 5000 nested parens": lambda i: {"regex": "(" * 5000 + "a" + ")" * 5000 + f"|x{{{i}}}"},
    "schema text 100,000 '['": lambda i: {"json_schema_text": "[" * 100000 + f'"{i}"'},
    # accepted: heavy-looking, but within every bound
    "accepted: regex [a-z]{0,60000}": lambda i: {"regex": f"[a-z]{{0,60000}}|x{{{i}}}"},
    "accepted: regex (a|b{0,100}){0,100}": lambda i: {"regex": f"(a|b{{0,100}}){{0,100}}|x{{{i}}}"},
}


def companion(i: int) -> dict:
    """A benign constraint that generates beside the probe."""
    return {"regex": f"[a-z ]{{0,200}}|x{{{i}}}"}


def add_parser(which) -> None:
    bombs = which.add_parser("bombs", help="grammar bombs: refusal time and the effect on a concurrent probe")
    bombs.add_argument("--address", help="a running server on loopback (default: start one on a free port)")
    bombs.add_argument("--rounds", type=int, default=7, help="probe pairs per row (median)")
    bombs.add_argument("--probe-tokens", type=int, default=32, help="output tokens of the probe")
    bombs.add_argument("--only", help="comma list: only the bombs whose name contains one of these")
    bombs.add_argument("--output", default="build/bench/bombs.json")
    bombs.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    import grpc

    from bench.server_process import ServerProcess
    from service._gen.formwork.v1 import generation_pb2 as pb
    from service._gen.formwork.v1 import generation_pb2_grpc as pb_grpc

    server = None
    address = args.address
    if address is None:
        server = ServerProcess(["--max-model-len", "512", "--num-blocks", "256", "--max-tokens-cap", "256",
                                "--threads", "2"])
        address = server.address
    channel = grpc.insecure_channel(address)
    stub = pb_grpc.GenerationStub(channel)
    probe = pb.GenerateRequest(prompt="Once upon a time", max_tokens=args.probe_tokens, temperature=0,
                               ignore_eos=True)

    def constrained(constraint: dict, max_tokens: int) -> "pb.GenerateRequest":
        from google.protobuf import json_format
        return json_format.ParseDict({"prompt": "Write:", "max_tokens": max_tokens, "temperature": 0,
                                      "constraint": {**constraint, "jump_forward": True}}, pb.GenerateRequest())

    def timed(call, *a, **kw) -> tuple[float, object]:
        start = time.perf_counter()
        try:
            result = call(*a, **kw)
        except grpc.RpcError as e:
            result = e
        return time.perf_counter() - start, result

    def probe_beside(constraint: dict | None) -> tuple[float, float | None, str]:
        """(probe latency, the other request's latency, its outcome)."""
        with ThreadPoolExecutor(1) as pool:
            other = pool.submit(timed, stub.Generate, constrained(constraint, args.probe_tokens),
                                timeout=300) if constraint is not None else None
            latency, _ = timed(stub.Generate, probe, timeout=300)
            if other is None:
                return latency, None, ""
            other_s, result = other.result()
        outcome = result.code().name if isinstance(result, grpc.RpcError) else "OK"
        return latency, other_s, outcome

    try:
        for _ in range(2):  # warm-up: compile paths, caches, allocator
            probe_beside(companion(-1))
        # control: the probe beside nothing, paired the same way; its spread is the noise floor
        chosen = {name: make for name, make in BOMBS.items()
                  if not args.only or any(part in name for part in args.only.split(","))}
        makers = {"control (nothing beside the probe)": None, "companion (benign constraint)": companion, **chosen}
        rows: dict[str, dict] = {name: {"probe_s": [], "ratio": [], "refusal_s": [], "validate_s": [], "outcome": ""}
                                 for name in ["baseline (probe alone)", *makers]}
        for round_index in range(args.rounds):
            for name, make in makers.items():
                # the probe alone right before or after (alternating), so drift cancels in the ratio
                alone_first = round_index % 2 == 0
                alone = probe_beside(None)[0] if alone_first else None
                latency, other_s, outcome = probe_beside(make(round_index) if make else None)
                if not alone_first:
                    alone = probe_beside(None)[0]
                row = rows[name]
                rows["baseline (probe alone)"]["probe_s"].append(alone)
                row["probe_s"].append(latency)
                row["ratio"].append(latency / alone)
                row["refusal_s"].append(other_s)
                row["outcome"] = outcome
                if name in BOMBS:
                    validate_s, report = timed(stub.ValidateConstraint, pb.ValidateConstraintRequest(
                        constraint=constrained(make(1000 + round_index), 1).constraint), timeout=300)
                    row["validate_s"].append(validate_s)
        info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30)
    finally:
        channel.close()
        if server is not None:
            server.stop()
    result = summarize(rows, args)
    result["server_idle_after"] = {"in_flight": info.load.num_in_flight, "free_kv_blocks": info.load.num_free_kv_blocks,
                                   "total_kv_blocks": info.load.num_total_kv_blocks}
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    return 0


def summarize(rows: dict[str, dict], args: argparse.Namespace) -> dict:
    """Per row: medians, and the probe's slowdown as the median of (probe beside it / the probe
    alone right next to it)."""
    companion_ratio = statistics.median(rows["companion (benign constraint)"]["ratio"])
    out = {"rounds": args.rounds, "probe_tokens": args.probe_tokens,
           "baseline_probe_s": statistics.median(rows["baseline (probe alone)"]["probe_s"]), "rows": []}
    for name, row in rows.items():
        if not row["ratio"]:
            continue
        ratio = statistics.median(row["ratio"])
        accepted = row["outcome"] == "OK"
        spread = (min(row["ratio"]) - 1, max(row["ratio"]) - 1)
        out["rows"].append({
            "bomb": name, "outcome": row["outcome"],
            "refusal_s": statistics.median(row["refusal_s"]) if row["outcome"] not in ("OK", "") else None,
            "validate_s": statistics.median(row["validate_s"]) if row["validate_s"] else None,
            "probe_s": statistics.median(row["probe_s"]), "vs_baseline": ratio - 1, "vs_baseline_range": spread,
            "vs_companion": ratio / companion_ratio - 1 if accepted else None})
    return out


def table(result: dict) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.0f} ms"

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value * 100:+.1f}%"

    lines = [f"probe: {result['probe_tokens']} tokens, {result['rounds']} rounds; the probe alone: "
             f"{result['baseline_probe_s'] * 1000:.0f} ms (median)", "",
             "| constraint | answer | refused in (Generate) | ValidateConstraint | probe p50 | vs baseline (median; "
             "range) | vs benign companion |", "|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        low, high = row["vs_baseline_range"]
        lines.append(f"| {row['bomb']} | {row['outcome'] or '-'} | {ms(row['refusal_s'])} | {ms(row['validate_s'])} | "
                     f"{ms(row['probe_s'])} | {pct(row['vs_baseline'])} ({pct(low)} .. {pct(high)}) | "
                     f"{pct(row['vs_companion'])} |")
    return "\n".join(lines)
