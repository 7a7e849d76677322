"""What `formwork batch` and `formwork extract` share: where the requests run (the executor
options), and a job run from its lines to its exit code."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from engine import args as engine_args
from engine.log_format import configure_logging
from service.batch.executor import Executor, ExecutorUnavailable
from service.batch.output_file import OutputFile, OutputFileError
from service.batch.progress import Progress
from service.batch.runner import JobRunner, RecordFormat
from service.limits import ServiceLimits
from service.security import API_KEY_ENV

if TYPE_CHECKING:
    from service.batch.lines import LineError, RequestLine

EXIT_RAN = 0  # the job ran to its end (error lines included)
EXIT_STOPPED = 1  # the executor stayed unavailable: rerun the same command to resume
EXIT_USAGE = 2  # bad arguments, an unreadable input, an output that is not this job's
EXIT_INTERRUPTED = 130  # Ctrl-C: what was written stays; rerun to resume

_LIMIT_DEFAULTS = ServiceLimits()


def add_executor_args(parser: argparse.ArgumentParser,
                      add_engine_args: Callable[[argparse.ArgumentParser], None] | None) -> None:
    """--address, --concurrency and the rest; the engine options (for the engine in this process)."""
    where = parser.add_argument_group("where the requests run (default: the engine in this process)")
    where.add_argument("--address", default=None,
                       help="HOST:PORT: a running Formwork gRPC server; http://HOST:PORT: any OpenAI-compatible "
                            "HTTP server")
    where.add_argument("--concurrency", type=int, default=None,
                       help="requests in flight at once (default: twice the engine's --max-num-seqs in process, "
                            "64 with --address)")
    where.add_argument("--api-key", default=None, help=f"the server's API key (default: ${API_KEY_ENV})")
    where.add_argument("--priority", type=int, default=None,
                       help="engine priority of every request, lower served first (default: each body's "
                            "formwork.priority); the engine in this process or a gRPC server")
    where.add_argument("--max-message-bytes", type=int, default=_LIMIT_DEFAULTS.max_message_bytes,
                       help="in process: the largest request body (default: %(default)s)")
    where.add_argument("--default-max-tokens", type=int, default=_LIMIT_DEFAULTS.default_max_tokens,
                       help="in process: max_tokens of a request that leaves it unset (default: %(default)s)")
    where.add_argument("--log-level", default="WARNING", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                       help="the engine's and the job's log (default: %(default)s; progress is shown anyway)")
    (add_engine_args or engine_args.add_engine_args)(parser)


async def start_executor(args: argparse.Namespace) -> Executor:
    """The executor the options name; ExecutorUnavailable when it cannot start, ValueError for a
    bad option."""
    api_key = args.api_key or os.environ.get(API_KEY_ENV, "").split(",")[0].strip() or None
    concurrency = args.concurrency or 64
    address: str | None = args.address
    if address is None:
        from service.batch_cli.inprocess import InProcessExecutor
        limits = ServiceLimits(max_message_bytes=args.max_message_bytes, default_max_tokens=args.default_max_tokens)
        return await InProcessExecutor.start(engine_args.engine_config_from_args(args), limits,
                                             log_level=getattr(logging, args.log_level), priority=args.priority)
    if address.startswith(("http://", "https://")):
        from service.batch.http_executor import HttpExecutor
        return HttpExecutor(address, concurrency=concurrency, api_key=api_key)
    from service.batch_cli.grpc_executor import GrpcExecutor
    return await GrpcExecutor.connect(address, api_key=api_key, priority=args.priority,
                                      max_message_bytes=args.max_message_bytes)


def run_job(args: argparse.Namespace, name: str, lines: list[RequestLine | LineError], output_path: str,
            records: RecordFormat, *, input_path: str | None = None) -> int:
    """Run `lines` into `output_path` (resuming it) on the executor the options name; the exit code."""
    configure_logging(getattr(logging, args.log_level), "text")
    if args.concurrency is not None and args.concurrency < 1:
        return _usage(name, f"--concurrency must be >= 1, got {args.concurrency}")
    if input_path is not None and Path(input_path).resolve() == Path(output_path).resolve():
        return _usage(name, "the output file must not be the input file")
    try:
        output = OutputFile(output_path, records.key_of)
    except OutputFileError as e:
        return _usage(name, str(e))
    with output:
        try:
            return asyncio.run(_run(args, name, lines, output, records))
        except ValueError as e:
            return _usage(name, str(e))
        except ExecutorUnavailable as e:
            print(f"formwork {name}: {e}", file=sys.stderr)
            return EXIT_STOPPED
        except OutputFileError as e:
            print(f"formwork {name}: {e}", file=sys.stderr)
            return EXIT_USAGE
        except KeyboardInterrupt:
            print(f"\nformwork {name}: interrupted; {len(output.done)} lines are in {output.path}, run the same "
                  f"command again to resume", file=sys.stderr)
            return EXIT_INTERRUPTED


async def _run(args: argparse.Namespace, name: str, lines: list[RequestLine | LineError], output: OutputFile,
               records: RecordFormat) -> int:
    if all(line.key in output.done for line in lines):  # nothing to do: no engine to start
        print(f"{name}: all {len(lines)} lines are already in {output.path}", file=sys.stderr)
        return EXIT_RAN
    executor = await start_executor(args)
    try:
        runner = JobRunner(executor, output, Progress(sys.stderr, name), records=records,
                           concurrency=args.concurrency)
        result = await runner.run(lines)
    finally:
        await executor.aclose()
    return EXIT_STOPPED if result.stopped else EXIT_RAN


def _usage(name: str, message: str) -> int:
    print(f"formwork {name}: error: {message}", file=sys.stderr)
    return EXIT_USAGE
