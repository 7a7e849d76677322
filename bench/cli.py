"""`formwork bench ...` subcommands."""
from __future__ import annotations

import argparse


def add_bench_parser(subparsers, add_engine_args) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks (figures and ratios from one run)")
    which = bench.add_subparsers(dest="bench", required=True)

    offline = which.add_parser("offline", help="offline throughput vs transformers generate")
    offline.add_argument("--num-prompts", type=int, default=64)
    offline.add_argument("--max-tokens", type=int, default=128)
    offline.add_argument("--hf-batch-size", type=int, default=64)
    offline.add_argument("--workload", choices=["chat", "json-extraction"], default="chat")
    offline.add_argument("--batch-sizes", default="1,8,32,64", help="json-extraction: concurrency levels")
    offline.add_argument("--skip-transformers", action="store_true")
    offline.add_argument("--hf-max-batch", type=int, default=8, help="json-extraction: largest batch for transformers")
    offline.add_argument("--output", help="json-extraction: write the results as JSON here")
    add_engine_args(offline)
    offline.set_defaults(func=_run_offline)

    coverage = which.add_parser("coverage", help="JSON-Schema coverage on jsonschemabench: compiled, rejected, valid")
    coverage.add_argument("--subset", action="append", help="repeat for several (default: all)")
    coverage.add_argument("--limit", type=int, default=10, help="schemas per subset")
    coverage.add_argument("--max-tokens", type=int, default=256)
    add_engine_args(coverage)
    coverage.set_defaults(func=_run_coverage)


def _run_offline(args: argparse.Namespace) -> int:
    from engine.cli import engine_config_from_args
    config = engine_config_from_args(args)
    if args.workload == "json-extraction":
        from bench.structured import main
    else:
        from bench.offline import main
    return main(args, config)


def _run_coverage(args: argparse.Namespace) -> int:
    from bench.coverage import main
    from engine.cli import engine_config_from_args
    return main(args, engine_config_from_args(args))
