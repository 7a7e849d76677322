"""`formwork bench coverage --compile-only`: which schemas compile in strict mode, how fast,
side by side with llguidance (a benchmark-only peer, bench/peers/llguidance_peer.py).

Formwork's figure is what a request meets: the size/depth limits and the compile timeout of
GrammarConfig, the grammar backend --grammar-backend names (auto: picked per schema; the backends
picked are counted), strict mode, no cache. The time is the time to the first token mask: both
backends fill the first mask inside their compile.
llguidance's is `LLMatcher.grammar_from_json_schema` plus `validate_grammar` with the same
tokenizer, its defaults (an unimplemented keyword is an error). Neither generates anything.
"""
from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from bench.compile_process import CompileProcess


@dataclass
class CompileTally:
    total: int = 0
    compiled: int = 0
    times_s: list[float] = field(default_factory=list)
    rejected: Counter = field(default_factory=Counter)
    backends: Counter = field(default_factory=Counter)  # backend name -> schemas it compiled

    def share(self) -> float:
        return self.compiled / self.total if self.total else 0.0

    def percentile_ms(self, q: float) -> float:
        if not self.times_s:
            return 0.0
        ordered = sorted(self.times_s)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def compile_formwork(schemas: list[tuple[str, str, dict]], engine_config,
                     records_path: str | None = None) -> dict[str, CompileTally]:
    """Strict-mode compiles, one schema after another in a child process. With `records_path`, one
    JSON line per schema is appended as it is measured, and schemas already there are not compiled
    again (their records count), so a long run can be stopped and resumed."""
    from engine.model_files import resolve_model
    from grammar.config import GrammarConfig

    import transformers
    model = resolve_model(engine_config.model if engine_config is not None else None)
    config = engine_config.grammar if engine_config is not None else GrammarConfig()
    done = _read_records(records_path)
    process = CompileProcess(str(model), transformers.AutoConfig.from_pretrained(model).vocab_size, config)
    tallies: dict[str, CompileTally] = defaultdict(CompileTally)
    records = open(records_path, "a", encoding="utf-8") if records_path else None
    try:
        for subset, sid, schema in schemas:
            record = done.get((subset, sid))
            if record is None:
                ok, reason, seconds, backend = process.compile(json.dumps(schema), config.compile_timeout_s)
                if ok and seconds > config.compile_timeout_s:
                    ok, reason = False, "compile time limit"
                record = {"subset": subset, "id": sid, "ok": ok, "reason": reason, "compile_s": seconds,
                          "backend": backend}
                if records is not None:
                    records.write(json.dumps(record) + "\n")
                    records.flush()
            tally = tallies[subset]
            tally.total += 1
            tally.compiled += record["ok"]
            tally.times_s.append(record["compile_s"])
            if not record["ok"]:
                tally.rejected[record["reason"]] += 1
            elif record.get("backend"):
                tally.backends[record["backend"]] += 1
    finally:
        process.close()
        if records is not None:
            records.close()
    return dict(tallies)


def _read_records(path: str | None) -> dict[tuple[str, str], dict]:
    if path is None or not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return {(r["subset"], r["id"]): r for r in map(json.loads, f) if r}


def interleaved(schemas: list[tuple[str, str, dict]]) -> list[tuple[str, str, dict]]:
    """One schema of each subset in turn, so that a run stopped early has measured every subset alike."""
    by_subset: dict[str, list] = defaultdict(list)
    for item in schemas:
        by_subset[item[0]].append(item)
    queues = list(by_subset.values())
    out = []
    for i in range(max(map(len, queues), default=0)):
        out += [queue[i] for queue in queues if i < len(queue)]
    return out


def compile_llguidance(schemas: list[tuple[str, str, dict]], engine_config) -> dict[str, CompileTally] | str:
    """llguidance's tallies, or why it was skipped."""
    from bench.peers import LLGUIDANCE, PeerSkipped, run_peer
    from engine.model_files import resolve_model

    model = resolve_model(engine_config.model if engine_config is not None else None)
    payload = {"tokenizer_dir": str(model),
               "schemas": [{"id": f"{subset}/{sid}", "schema": schema} for subset, sid, schema in schemas]}
    try:
        result = run_peer(LLGUIDANCE, payload, timeout_s=1800)
    except PeerSkipped as e:
        return str(e)
    tallies: dict[str, CompileTally] = defaultdict(CompileTally)
    for (subset, _, _), record in zip(schemas, result["results"]):
        tally = tallies[subset]
        tally.total += 1
        tally.compiled += record["ok"]
        tally.times_s.append(record["compile_s"])
        if not record["ok"]:
            tally.rejected[record["error"].split("\n")[0][:60]] += 1
    return dict(tallies)


def _overall(tallies: dict[str, CompileTally]) -> CompileTally:
    out = CompileTally()
    for t in tallies.values():
        out.total += t.total
        out.compiled += t.compiled
        out.times_s += t.times_s
        out.rejected.update(t.rejected)
        out.backends.update(t.backends)
    return out


def print_compile_report(ours: dict[str, CompileTally], peer: dict[str, CompileTally] | str,
                         grammar_backend: str = "") -> None:
    if grammar_backend:
        print(f"formwork grammar backend: {grammar_backend}")
    print(f"{'subset':<16} {'n':>4}  {'formwork':>8} {'p50 ms':>7} {'p99 ms':>8}   {'llguidance':>10} "
          f"{'p50 ms':>7} {'p99 ms':>8}")
    rows = [*ours.items(), ("overall", _overall(ours))]
    for subset, t in rows:
        line = f"{subset:<16} {t.total:>4}  {t.share():>8.1%} {t.percentile_ms(.5):>7.1f} {t.percentile_ms(.99):>8.1f}"
        if isinstance(peer, dict):
            p = peer.get(subset) if subset != "overall" else _overall(peer)
            if p is not None:
                line += f"   {p.share():>10.1%} {p.percentile_ms(.5):>7.1f} {p.percentile_ms(.99):>8.1f}"
        print(line)
    if isinstance(peer, str):
        print(f"llguidance skipped: {peer}")
    for name, tallies in (("formwork", ours), ("llguidance", peer)):
        if isinstance(tallies, dict):
            reasons = _overall(tallies).rejected
            print(f"{name} rejected: " + "; ".join(f"{c} x {r}" for r, c in reasons.most_common(12)))
    picked = _overall(ours).backends
    print("formwork compiled by: " + "; ".join(f"{c} x {name}" for name, c in picked.most_common()))


def main(args, engine_config) -> int:
    from bench.coverage import load_schemas
    from bench.datasets import SUBSETS

    schemas = interleaved(load_schemas(args.subset or list(SUBSETS), args.limit, data=args.data))
    ours = compile_formwork(schemas, engine_config, args.records)
    peer = compile_llguidance(schemas, engine_config) if not args.no_peer else "--no-peer"
    print_compile_report(ours, peer, engine_config.grammar.grammar_backend if engine_config is not None else "")
    return 0
