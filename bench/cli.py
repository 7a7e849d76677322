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
    offline.add_argument("--prefill-prompts", type=int, default=4, help="chat: long prompts of the prefill rate")
    offline.add_argument("--prefill-tokens", type=int, default=1500, help="chat: tokens of each prefill prompt")
    offline.add_argument("--repeats", type=int, default=2,
                         help="json-extraction: rounds of all modes, alternated; each mode keeps its fastest round")
    offline.add_argument("--hf-max-batch", type=int, default=8, help="json-extraction: largest batch for transformers")
    offline.add_argument("--output", help="json-extraction: write the results as JSON here")
    offline.add_argument("--items", type=int, default=0,
                         help="json-extraction: only the first N items (repeated): fewer distinct prompts to prefill")
    offline.add_argument("--peers", type=_csv, default=[],
                         help="json-extraction: comma list of vllm, vllm-compiled (bench/peers), after Formwork")
    add_engine_args(offline)
    offline.set_defaults(func=_run_offline)

    coverage = which.add_parser("coverage", help="JSON-Schema coverage on JSONSchemaBench: compiled, rejected, valid")
    coverage.add_argument("--subset", action="append", help="repeat for several (default: all)")
    coverage.add_argument("--limit", type=int, default=10, help="schemas per subset")
    coverage.add_argument("--max-tokens", type=int, default=256)
    coverage.add_argument("--close-early", choices=["on", "off", "both"], default="both",
                          help="run with the constraints' close_early on, off, or both, one after the other")
    coverage.add_argument("--data", default=None,
                          help="a folder of <Subset>.jsonl (e.g. the full JSONSchemaBench; default: the carried sample)")
    coverage.add_argument("--compile-only", action="store_true",
                          help="compile in strict mode only (no generation): share and p50/p99 time per subset, "
                               "beside llguidance when its peer is installed")
    coverage.add_argument("--no-peer", action="store_true", help="--compile-only without the llguidance peer")
    coverage.add_argument("--records", default=None,
                          help="--compile-only: append one JSON line per schema to this file as it is measured; "
                               "schemas already in it are not compiled again (resume a long run)")
    add_engine_args(coverage)
    coverage.set_defaults(func=_run_coverage)

    accuracy = which.add_parser("accuracy", help="field accuracy of constrained answers, per setting and peer")
    accuracy.add_argument("--settings", type=_csv, default=None,
                          help="comma list of whitespace modes, each optionally with :no-jf, :no-close and/or :fields "
                               "(default: compact,spaced,bounded,any,bounded:no-jf,bounded:fields)")
    accuracy.add_argument("--workloads", type=_csv, default=None,
                          help="comma list of json-extraction, person, function-call (default: all)")
    accuracy.add_argument("--peers", type=_csv, default=[], help="comma list of vllm, transformers")
    accuracy.add_argument("--output", default=None, help="write the rows (with each item's score) as JSON here")
    accuracy.add_argument("--baseline", default=None,
                          help="an --output of another run (e.g. unquantized): each row's difference from it, "
                               "item by item, with its standard error")
    add_engine_args(accuracy)
    accuracy.set_defaults(func=_run_accuracy)

    serve = which.add_parser("serve", help="load a gRPC server (started here, or --address) and run peers beside it",
                             description="Load generator over gRPC on loopback; one JSON result file, PNG plots.")
    serve.add_argument("--address", help="a running server on loopback (default: start one on a free port)")
    serve.add_argument("--protocol", choices=["grpc", "http"], default="grpc",
                       help="http: every Formwork run over gRPC and, right after, over the OpenAI-compatible HTTP API")
    serve.add_argument("--http-address", help="with --address and --protocol http: the server's HTTP HOST:PORT")
    serve.add_argument("--model", default=None, help="model folder (default: the packaged SmolLM2-135M-Instruct)")
    serve.add_argument("--workload", choices=["json-extraction", "mixed-schemas", "unconstrained", "tool-calls"],
                       default="json-extraction")
    serve.add_argument("--modes", type=_csv, default=["unconstrained", "constrained", "unconstrained-matched", "constrained+jf"],
                       help="comma list of unconstrained, constrained (jump-forward off), unconstrained-matched (as long as constrained, EOS ignored), constrained+jf, constrained+jf+spec (and speculative decoding from the prompt)")
    load = serve.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=_csv_int, default=[1, 8, 32, 64], help="comma list (closed loop)")
    load.add_argument("--rate", type=float, default=None, help="Poisson arrivals, requests/s (open loop)")
    serve.add_argument("--num-requests", type=int, default=None,
                       help="requests per run (default: the concurrency, at least 4, at most --max-requests)")
    serve.add_argument("--max-requests", type=int, default=128, help="cap on the default request count")
    serve.add_argument("--duration", type=float, default=600.0, help="seconds per run at most (no new requests after)")
    serve.add_argument("--max-tokens", type=int, default=256)
    serve.add_argument("--data", default=None,
                       help="mixed-schemas: a folder of <Subset>.jsonl (default: the carried JSONSchemaBench sample)")
    serve.add_argument("--items", type=_csv, default=None, help="comma list of json-extraction item ids (default: all)")
    serve.add_argument("--tool-choice", choices=["required", "auto"], default="required",
                       help="tool-calls: the constrained modes' (and the peers') tool_choice")
    serve.add_argument("--tool-call-syntax", choices=_tool_call_syntaxes(), default=None,
                       help="tool-calls: the started server's syntax (default: the model's own); peers parse the same")
    serve.add_argument("--rpc-timeout", type=float, default=1200.0, help="deadline of every RPC, seconds")
    serve.add_argument("--peers", type=_csv, default=[],
                       help="comma list of transformers, llama-cpp, vllm, vllm-ngram, vllm-compiled, vllm-http")
    serve.add_argument("--roofline", action="store_true", help="measure bandwidth; step time / weight-read floor")
    serve.add_argument("--burst", action="store_true", help="ITL of steady requests under a burst of new schemas")
    serve.add_argument("--speculative", action="store_true",
                       help="also run mode constrained+jf+spec right after constrained+jf: speculation on vs off")
    serve.add_argument("--smoke", action="store_true", help="tiny run (concurrency 4, 8 requests); checks the numbers")
    serve.add_argument("--full", action="store_true", help="concurrency 1,8,32,64, every mode, roofline and burst")
    serve.add_argument("--output", default="build/bench/serve.json", help="the JSON result file")
    serve.add_argument("--plots-dir", default=None, help="write PNG plots here")
    serve.add_argument("--output-dir", default=None, help="shorthand: DIR/serve.json and plots in DIR")
    serve.add_argument("--json", action="store_true", help="print a machine-readable summary on stdout")
    serve.set_defaults(func=_run_serve)

    from bench.bombs import add_parser as add_bombs_parser
    add_bombs_parser(which)
    from bench.compile_interference import add_parser as add_compile_interference_parser
    add_compile_interference_parser(which)
    from bench.affinity import add_affinity_parser
    add_affinity_parser(which)
    from bench.batch_interference import add_parser as add_batch_interference_parser
    add_batch_interference_parser(which)
    from bench.grammar_backends import add_parser as add_grammar_backends_parser
    add_grammar_backends_parser(which)


def _tool_call_syntaxes() -> tuple[str, ...]:
    from grammar.chat.tool_calls import SYNTAXES
    return tuple(SYNTAXES)


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _csv_int(text: str) -> list[int]:
    try:
        return [int(part) for part in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _run_serve(args: argparse.Namespace) -> int:
    from bench.peers import PEERS
    from bench.serve_bench import MODES, main
    unknown = [p for p in args.peers if p not in PEERS] + [m for m in args.modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown peer or mode {', '.join(unknown)}; peers: {', '.join(PEERS)}; "
                         f"modes: {', '.join(MODES)}")
    if args.output_dir:
        args.output, args.plots_dir = f"{args.output_dir}/serve.json", args.plots_dir or args.output_dir
    return main(args)


def _run_offline(args: argparse.Namespace) -> int:
    from engine.args import engine_config_from_args
    config = engine_config_from_args(args)
    if args.workload == "json-extraction":
        from bench.structured import main
    else:
        from bench.offline import main
    return main(args, config)


def _run_accuracy(args: argparse.Namespace) -> int:
    from bench.accuracy import DEFAULT_SETTINGS, WORKLOADS, main
    from engine.args import engine_config_from_args
    args.settings = args.settings or list(DEFAULT_SETTINGS)
    args.workloads = args.workloads or list(WORKLOADS)
    return main(args, engine_config_from_args(args))


def _run_coverage(args: argparse.Namespace) -> int:
    from engine.args import engine_config_from_args
    if args.compile_only:
        from bench.compile_coverage import main as compile_main
        return compile_main(args, engine_config_from_args(args))
    from bench.coverage import main
    return main(args, engine_config_from_args(args))

