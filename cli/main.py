"""`formwork` command line: generate, bench, serve. Heavy imports happen inside the commands."""
from __future__ import annotations

import argparse
import json
import sys

from grammar.backend import JSON_WHITESPACE_MODES


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default=None, help="local Hugging Face model folder (default: packaged SmolLM2-135M-Instruct)")
    g.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    g.add_argument("--max-num-seqs", type=int, default=64, help="requests per step")
    g.add_argument("--max-num-batched-tokens", type=int, default=512, help="token budget per step")
    g.add_argument("--num-blocks", type=int, default=None, help="KV cache blocks (default: from --kv-cache-gib on CPU, --gpu-memory-utilization on CUDA)")
    g.add_argument("--kv-cache-gib", type=float, default=1.0, help="CPU: KV cache memory when --num-blocks is unset")
    g.add_argument("--no-prefix-caching", action="store_true")
    g.add_argument("--no-jump-forward", action="store_true", help="engine default for jump-forward decoding")
    g.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    g.add_argument("--device", default="cpu")
    g.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                   help="weights and activations (auto: bfloat16 on CUDA and on CPUs with bf16 dot products)")
    # issue 7: CUDA options (a CPU engine ignores them)
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV cache block")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="CUDA: fraction of device memory for weights + KV cache + activations (KV takes the rest)")
    g.add_argument("--enforce-eager", action="store_true", help="CUDA: no CUDA graphs for decode steps")
    g.add_argument("--attention-backend", choices=["auto", "flash_attn", "torch"], default="auto",
                   help="CUDA: flash-attn if usable (auto), flash-attn or an error, or torch SDPA")
    from engine.config import GrammarConfig
    defaults = GrammarConfig()
    b = parser.add_argument_group("grammar bounds (a constraint past one is refused: docs/constraints.md)")
    b.add_argument("--compile-timeout", type=float, default=defaults.compile_timeout_s,
                   help="seconds one grammar compile may take (default: %(default)s)")
    b.add_argument("--max-schema-depth", type=int, default=defaults.max_schema_depth,
                   help="JSON-schema nesting depth, in schema levels (default: %(default)s)")
    b.add_argument("--max-forced-bytes", type=int, default=defaults.max_forced_bytes,
                   help="forced text jump-forward takes per step, and the most output a grammar may need at "
                        "one point (default: %(default)s)")
    b.add_argument("--max-repeat-count", type=int, default=defaults.max_repeat_count,
                   help="largest count of a regex quantifier {m,n} (default: %(default)s)")
    b.add_argument("--max-fill-ms", type=float, default=defaults.max_fill_ms,
                   help="CPU milliseconds one request's bitmask fill may take (default: %(default)s)")


def engine_config_from_args(args: argparse.Namespace):
    from engine.config import CacheConfig, CudaConfig, EngineConfig, SchedulerConfig
    from grammar.config import GrammarConfig
    return EngineConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        num_threads=args.threads,
        scheduler=SchedulerConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens),
        cache=CacheConfig(block_size=args.block_size, num_blocks=args.num_blocks,
                          kv_cache_bytes=int(args.kv_cache_gib * (1 << 30)),
                          enable_prefix_caching=not args.no_prefix_caching),
        grammar=GrammarConfig(jump_forward=not args.no_jump_forward, compile_timeout_s=args.compile_timeout,
                              max_schema_depth=args.max_schema_depth, max_forced_bytes=args.max_forced_bytes,
                              max_repeat_count=args.max_repeat_count, max_fill_ms=args.max_fill_ms),
        cuda=CudaConfig(gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=args.enforce_eager,
                        attention_backend=args.attention_backend),
    )


def add_constraint_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("constraint (at most one)")
    g.add_argument("--json-schema", metavar="FILE|-", help="JSON Schema file, or - for stdin")
    g.add_argument("--json-object", action="store_true", help="any JSON object")
    g.add_argument("--regex", metavar="R")
    g.add_argument("--grammar", metavar="FILE", help="EBNF grammar file (xgrammar syntax)")
    g.add_argument("--choice", action="append", metavar="TEXT", help="repeat for each allowed output")
    g.add_argument("--best-effort", action="store_true", help="accept schema keywords that cannot be enforced")
    g.add_argument("--any-whitespace", action="store_true", help="allow free whitespace in JSON")
    g.add_argument("--whitespace", choices=JSON_WHITESPACE_MODES, default="",
                   help="whitespace between JSON tokens (default: the engine's, docs/constraints.md)")


def constraint_from_args(args: argparse.Namespace):
    from grammar.constraint import Constraint
    given = [name for name in ("json_schema", "json_object", "regex", "grammar", "choice") if getattr(args, name)]
    if len(given) > 1:
        raise ValueError(f"give at most one constraint, got {', '.join('--' + g.replace('_', '-') for g in given)}")
    if not given:
        return None
    kind = given[0]
    spec = ""
    if kind in ("json_schema", "grammar"):
        path = getattr(args, kind)
        spec = sys.stdin.read() if path == "-" else _read_file(path)
    elif kind == "regex":
        spec = args.regex
    constraint = Constraint(kind=kind, spec=spec, choices=args.choice or [], strict=not args.best_effort,
                            any_whitespace=args.any_whitespace, whitespace=args.whitespace)
    constraint.validate()
    return constraint


def _read_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None


def cmd_generate(args: argparse.Namespace) -> int:
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed,
                            constraint=constraint_from_args(args))
    if args.raw:
        prompt = args.prompt
    else:
        prompt = ([{"role": "system", "content": args.system}] if args.system else []) + \
                 [{"role": "user", "content": args.prompt}]
    params.validate()  # before the model loads: a bad flag fails at once
    llm = LLM(config=engine_config_from_args(args))
    try:
        out = llm.generate([prompt], params)[0]
    finally:
        llm.shutdown()
    if args.json:
        print(json.dumps({
            "text": out.text,
            "finish_reason": out.finish_reason.name.lower() if out.finish_reason is not None else None,
            "error": out.error,
            "usage": {"prompt_tokens": out.num_prompt_tokens, "completion_tokens": out.num_output_tokens,
                      "cached_prompt_tokens": out.num_cached_tokens},
            "forward_passes": out.num_forward_passes,
            "forced_tokens": out.num_forced_tokens,
            "not_enforced": out.not_enforced,
        }, ensure_ascii=False))
    else:
        print(out.text)
    if out.error:
        print(f"error: {out.error}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="formwork", description="Structured-output generation engine and server")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate once, offline")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--system", default=None, help="system message (chat mode)")
    gen.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    gen.add_argument("--max-tokens", type=int, default=256)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the CLI's default)")
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--json", action="store_true", help="print one JSON object with text, finish_reason, usage")
    add_constraint_args(gen)
    add_engine_args(gen)
    gen.set_defaults(func=cmd_generate)

    from bench.cli import add_bench_parser
    add_bench_parser(sub, add_engine_args)
    try:
        from service.cli import add_serve_parser
    except ImportError:  # the service is optional for offline use
        pass
    else:
        add_serve_parser(sub, add_engine_args)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except ValueError as e:
        print(f"formwork: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
