"""`formwork generate`: one generation, offline, in this process. Heavy imports happen inside the command."""
from __future__ import annotations

import argparse
import json
import sys

from engine.args import add_engine_args, engine_config_from_args
from grammar.constraint import JSON_WHITESPACE_MODES


def add_generate_parser(subparsers) -> None:
    gen = subparsers.add_parser("generate", help="generate once, offline")
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
                      "cached_prompt_tokens": out.counters.num_cached_tokens},
            "forward_passes": out.counters.num_forward_passes,
            "forced_tokens": out.counters.num_forced_tokens,
            "not_enforced": out.not_enforced,
        }, ensure_ascii=False))
    else:
        print(out.text)
    if out.error:
        print(f"error: {out.error}", file=sys.stderr)
        return 1
    return 0
