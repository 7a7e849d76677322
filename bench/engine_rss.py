"""The engine's resident memory over waves of constrained requests, in this one process.

    python -m bench.engine_rss [--waves 12] [--requests 64] [--mmap-threshold BYTES] [--onednn-cache N]
                               [--trim-interval S] [--output build/engine_rss.json]

Each wave sends `--requests` schema-constrained chat requests at once through the offline LLM
(the soak's kind: a small person schema, sampled, a different prompt length and seed each), and
prints RSS after it and the wave's mean step time. The host-memory options are the engine's
(engine/config.py HostMemoryConfig); 0 / -1 turn a setting off, to compare with glibc's and
oneDNN's own behaviour. Run it in a fresh process: oneDNN reads its cache size once.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from engine.config import EngineConfig, HostMemoryConfig
from engine.core.memory_watchdog import rss_bytes
from engine.sampling_params import SamplingParams
from grammar.constraint import Constraint

PERSON_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
                 "properties": {"name": {"type": "string", "maxLength": 12},
                                "age": {"type": "integer", "minimum": 0, "maximum": 120}}}
_MIB = 1 << 20


def wave_prompts(wave: int, num_requests: int) -> list[list[dict]]:
    """Chat prompts of many lengths, so the steps meet many shapes (as a serving engine does)."""
    return [[{"role": "user", "content": f"Invent person number {wave}-{i}. " + "Be brief. " * ((i * 7 + wave) % 23)
              + "Answer in JSON."}] for i in range(num_requests)]


def host_memory_from_args(args: argparse.Namespace) -> HostMemoryConfig:
    return HostMemoryConfig(malloc_mmap_threshold_bytes=args.mmap_threshold or None,
                            onednn_primitive_cache_capacity=None if args.onednn_cache < 0 else args.onednn_cache,
                            trim_interval_s=args.trim_interval)


def run(args: argparse.Namespace) -> list[dict]:
    from engine.llm import LLM

    llm = LLM(config=EngineConfig(model=args.model, num_threads=args.threads, host_memory=host_memory_from_args(args)))
    constraint = Constraint(kind="json_schema", spec=json.dumps(PERSON_SCHEMA))
    rows = [{"wave": 0, "rss_mib": rss_bytes() / _MIB}]
    print(json.dumps({"host_memory": vars(llm.engine.config.host_memory), **rows[0]}), flush=True)
    for wave in range(1, args.waves + 1):
        prompts = wave_prompts(wave, args.requests)
        params = [SamplingParams(max_tokens=args.max_tokens, temperature=0.8, seed=wave * 1000 + i,
                                 constraint=constraint) for i in range(len(prompts))]
        llm.engine.step_stats.take_timings()  # the steps before this wave
        started = time.monotonic()
        outputs = llm.generate(prompts, params)
        timings = llm.engine.step_stats.take_timings()
        row = {"wave": wave, "rss_mib": round(rss_bytes() / _MIB, 1), "wall_s": round(time.monotonic() - started, 2),
               "num_steps": len(timings), "mean_step_ms": round(1e3 * statistics.fmean(t.total_s for t in timings), 2),
               "num_output_tokens": sum(len(o.token_ids) for o in outputs),
               "num_trims": llm.engine.heap_trimmer.num_trims, "trim_ms": round(1e3 * llm.engine.heap_trimmer.trim_s, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    llm.shutdown()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.engine_rss", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--waves", type=int, default=12)
    parser.add_argument("--requests", type=int, default=64, help="per wave, all at once")
    parser.add_argument("--max-tokens", type=int, default=48)
    defaults = HostMemoryConfig()
    parser.add_argument("--mmap-threshold", type=int, default=defaults.malloc_mmap_threshold_bytes or 0,
                        help="bytes; 0: glibc's dynamic threshold (default: %(default)s)")
    parser.add_argument("--onednn-cache", type=int, default=defaults.onednn_primitive_cache_capacity,
                        help="primitives; -1: oneDNN's default (default: %(default)s)")
    parser.add_argument("--trim-interval", type=float, default=defaults.trim_interval_s,
                        help="seconds; 0: never (default: %(default)s)")
    parser.add_argument("--output", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    rows = run(args)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
