"""The `formwork` command: generate, serve, bench, batch, extract, each registered by its own layer."""
from __future__ import annotations

import argparse
import sys

from cli.generate import add_generate_parser
from engine.args import add_engine_args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="formwork", description="Structured-output generation engine and server")
    sub = parser.add_subparsers(dest="command", required=True)

    add_generate_parser(sub)

    from bench.cli import add_bench_parser
    add_bench_parser(sub, add_engine_args)
    try:
        from service.batch_cli.batch_command import add_batch_parser
        from service.batch_cli.extract_command import add_extract_parser
        from service.cli import add_serve_parser
        from service.cluster import add_cluster_parser
    except ImportError:  # the service is optional for offline use
        pass
    else:
        add_serve_parser(sub, add_engine_args)
        add_cluster_parser(sub)
        add_batch_parser(sub, add_engine_args)
        add_extract_parser(sub, add_engine_args)
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
