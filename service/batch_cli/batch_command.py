"""`formwork batch`: a file of OpenAI batch request lines answered into a file of output lines.

    formwork batch INPUT.jsonl OUTPUT.jsonl [engine options] [--address HOST:PORT | http://HOST:PORT]
                   [--concurrency N]

Run again on the same files, it skips the lines already in OUTPUT.jsonl (docs/batch.md).
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from service.batch.lines import read_lines
from service.batch.runner import BATCH_RECORDS
from service.batch_cli.job import EXIT_USAGE, add_executor_args, run_job


def add_batch_parser(subparsers: argparse._SubParsersAction,
                     add_engine_args: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    parser = subparsers.add_parser(
        "batch", help="answer a file of OpenAI batch requests (resumable)",
        description="Answer each line of INPUT (OpenAI's batch format: custom_id, method, url, body) into OUTPUT "
                    "(OpenAI's batch output format), on the engine in this process or a server. Resumable: run "
                    "again, it skips every custom_id already in OUTPUT.")
    parser.add_argument("input", help="the request lines (JSONL)")
    parser.add_argument("output", help="the output lines (JSONL), appended to: created if missing, resumed if not")
    add_executor_args(parser, add_engine_args)
    parser.set_defaults(func=run_batch)


def run_batch(args: argparse.Namespace) -> int:
    try:
        with open(args.input, "rb") as f:
            raw_lines = f.read().split(b"\n")
    except OSError as e:
        print(f"formwork batch: error: cannot read {args.input}: {e.strerror}", file=sys.stderr)
        return EXIT_USAGE
    return run_job(args, "batch", read_lines(raw_lines), args.output, BATCH_RECORDS, input_path=args.input)
