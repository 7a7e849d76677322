"""`formwork serve`: the gRPC server (and the OpenAI-compatible HTTP API) on one engine core process.

    formwork serve [--model PATH] [--host 127.0.0.1] [--port 50051] [--http-port 8000 | --no-http] [engine options] [limits]
    python -m service.cli serve ...   (the same, without the console script)

The `formwork` command (cli/main.py) registers this subcommand with `add_serve_parser(subparsers,
add_engine_args)`; the parsed namespace carries `func`, which runs it and returns the exit code.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from engine import args as engine_args
from engine.config import EngineConfig, SchedulerConfig
from engine.core.memory_watchdog import DEFAULT_FRACTION_OF_MEMORY, MemoryLimit, machine_memory_bytes
from engine.log_format import configure_logging
from grammar.chat.tool_calls import SYNTAXES
from service.batch.api_config import BatchApiConfig, default_data_dir
from service.limits import ServiceLimits
from service.observability.telemetry import Telemetry
from service.security import API_KEY_ENV, SecurityConfig, load_api_keys, load_tls_files
from service.supervisor import RestartPolicy

if TYPE_CHECKING:
    from service.grpc.server import GenerationServer
    from service.http.server import HttpServer

_LIMIT_DEFAULTS = ServiceLimits()
_BATCH_DEFAULTS = BatchApiConfig(data_dir=default_data_dir())
_RESTART_DEFAULTS = RestartPolicy()


def add_serve_parser(subparsers: argparse._SubParsersAction,
                     add_engine_args: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.ArgumentParser:
    """Register `serve`; `add_engine_args` adds the engine options (default: engine/args.py's)."""
    parser = subparsers.add_parser("serve", help="serve the Generation gRPC API",
                                   description="Serve formwork.v1.Generation (plus health and reflection) over gRPC.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=50051, help="port (default: %(default)s; 0: any free port)")
    parser.add_argument("--http-port", type=int, default=8000,
                        help="port of the OpenAI-compatible HTTP API, docs/http.md (default: %(default)s; 0: any free "
                             "port)")
    parser.add_argument("--no-http", action="store_true", help="serve gRPC only")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    observability = parser.add_argument_group("observability (docs/observability.md)")
    observability.add_argument("--log-format", default="text", choices=("text", "json"),
                               help="json: one JSON object a line, for log pipelines (default: %(default)s)")
    observability.add_argument("--no-metrics", action="store_true",
                               help="no Prometheus metrics (GET /metrics answers 404; the engine collects nothing)")
    observability.add_argument("--otlp-endpoint", default=None,
                               help="export OpenTelemetry traces over OTLP/HTTP to this URL, e.g. "
                                    "http://127.0.0.1:4318/v1/traces (default: no tracing)")
    (add_engine_args or engine_args.add_engine_args)(parser)
    limits = parser.add_argument_group("limits")
    limits.add_argument("--max-queue-len", type=int, default=SchedulerConfig().max_num_waiting,
                        help="requests waiting beyond the batch; more get RESOURCE_EXHAUSTED (default: %(default)s)")
    limits.add_argument("--max-message-bytes", type=int, default=_LIMIT_DEFAULTS.max_message_bytes,
                        help="largest request or response message (default: %(default)s)")
    limits.add_argument("--max-constraint-bytes", type=int, default=_LIMIT_DEFAULTS.max_constraint_bytes,
                        help="largest schema, regex, grammar or choice list (default: %(default)s)")
    limits.add_argument("--max-tokens-cap", type=int, default=_LIMIT_DEFAULTS.max_tokens_cap,
                        help="largest max_tokens a request may ask for (default: %(default)s)")
    limits.add_argument("--default-max-tokens", type=int, default=_LIMIT_DEFAULTS.default_max_tokens,
                        help="max_tokens of a request that leaves it unset (default: %(default)s)")
    limits.add_argument("--shutdown-grace", type=float, default=_LIMIT_DEFAULTS.shutdown_grace_s,
                        help="seconds in-flight requests get to finish after SIGTERM (default: %(default)s)")
    limits.add_argument("--drain-delay", type=float, default=_LIMIT_DEFAULTS.drain_delay_s,
                        help="after SIGTERM, seconds health reports NOT_SERVING while new calls are still taken, "
                             "before the grace period: set it above a load balancer's health-check interval "
                             "(docs/deploy.md; default: %(default)s)")
    chat = parser.add_argument_group("chat format (defaults: the model family's)")
    chat.add_argument("--tool-call-syntax", choices=tuple(SYNTAXES), default="",
                      help="how the model writes tool calls (default: by its family; hermes otherwise)")
    chat.add_argument("--think-markers", metavar="START,END", default="",
                      help="the markers around the model's think section, e.g. '<think>,</think>'")
    chat.add_argument("--no-reasoning", action="store_true", help="the model does not think (no think section)")
    healing = parser.add_argument_group("self-healing")
    healing.add_argument("--engine-restarts", type=int, default=_RESTART_DEFAULTS.max_restarts,
                         help="consecutive engine crashes to restart after; 0: never restart (default: %(default)s)")
    healing.add_argument("--engine-restart-backoff", type=float, default=_RESTART_DEFAULTS.backoff_s,
                         help="seconds before the first restart, doubled for each consecutive crash, up to "
                              f"{_RESTART_DEFAULTS.max_backoff_s:.0f} (default: %(default)s)")
    healing.add_argument("--quarantine-time", type=float, default=_RESTART_DEFAULTS.quarantine_s,
                         help="seconds a constraint in flight at two engine deaths is refused; 0: never "
                              "(default: %(default)s)")
    healing.add_argument("--engine-memory-limit-gib", type=float, default=None,
                         help="the engine process's own memory ceiling (RSS); it refuses new work past 90%% of it "
                              "and restarts past it; 0: none (default: "
                              f"{DEFAULT_FRACTION_OF_MEMORY * 100:.0f}%% of this machine's memory, "
                              f"{DEFAULT_FRACTION_OF_MEMORY * machine_memory_bytes() / (1 << 30):.1f})")
    access = parser.add_argument_group("access (docs/api.md, \"Securing a server\")")
    access.add_argument("--tls-cert", help="PEM certificate chain: serve TLS (with --tls-key)")
    access.add_argument("--tls-key", help="PEM private key of --tls-cert")
    access.add_argument("--tls-client-ca", help="PEM CA: mutual TLS, clients must present a certificate it signed")
    access.add_argument("--api-key", action="append", default=[],
                        help=f"a key callers send as 'authorization: Bearer KEY' (repeatable; keys stay out of ps "
                             f"with --api-key-file or ${API_KEY_ENV}, comma-separated)")
    access.add_argument("--api-key-file", help="a file of API keys, one a line (# comments)")
    access.add_argument("--protect-health", action="store_true",
                        help="grpc.health.v1 needs a key too (default: open, for probes and load balancers)")
    access.add_argument("--max-concurrent-per-key", type=int, default=0,
                        help="Generate calls in flight per API key; more get RESOURCE_EXHAUSTED (default: no limit)")
    batches = parser.add_argument_group("files and batches (OpenAI's Files and Batches APIs, docs/batch-api.md)")
    batches.add_argument("--data-dir", default=None,
                         help="where uploaded files, batch outputs and their SQLite database live; one server a "
                              "directory (default: $FORMWORK_CACHE/data, else ~/.cache/formwork/data; created)")
    batches.add_argument("--no-batches", action="store_true", help="serve HTTP without /v1/files and /v1/batches")
    batches.add_argument("--max-file-bytes", type=int, default=_BATCH_DEFAULTS.max_file_bytes,
                         help="largest file an upload may send (default: %(default)s)")
    batches.add_argument("--batch-concurrency", type=int, default=_BATCH_DEFAULTS.max_concurrent_lines,
                         help="a running batch's lines in the engine at once, at low priority beside interactive "
                              "requests (default: %(default)s)")
    parser.set_defaults(func=run_serve)
    return parser


def security_from_args(args: argparse.Namespace) -> SecurityConfig:
    return SecurityConfig(tls=load_tls_files(args.tls_cert, args.tls_key, args.tls_client_ca),
                          api_keys=load_api_keys(args.api_key, args.api_key_file),
                          protect_health=args.protect_health, max_concurrent_per_key=args.max_concurrent_per_key)


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """engine/args.py's EngineConfig, with the service's queue length and constraint size."""
    config = engine_args.engine_config_from_args(args)
    return replace(config, collect_stats=not args.no_metrics,
                   scheduler=replace(config.scheduler, max_num_waiting=args.max_queue_len),
                   grammar=replace(config.grammar,
                                   max_spec_bytes=max(args.max_constraint_bytes, config.grammar.max_spec_bytes)))


def batch_config_from_args(args: argparse.Namespace) -> BatchApiConfig | None:
    """The Files and Batches APIs' settings; None without them (--no-batches, --no-http)."""
    if args.no_batches or args.no_http:
        return None
    data_dir = Path(args.data_dir).expanduser() if args.data_dir else default_data_dir()
    return BatchApiConfig(data_dir=data_dir, max_file_bytes=args.max_file_bytes,
                          max_concurrent_lines=args.batch_concurrency, required=args.data_dir is not None)


def restart_policy_from_args(args: argparse.Namespace) -> RestartPolicy:
    return RestartPolicy(max_restarts=args.engine_restarts, backoff_s=args.engine_restart_backoff,
                         quarantine_s=args.quarantine_time)


def memory_limit_from_args(args: argparse.Namespace) -> MemoryLimit | None:
    gib = args.engine_memory_limit_gib
    if gib is None:
        gib = DEFAULT_FRACTION_OF_MEMORY * machine_memory_bytes() / (1 << 30)
    if gib < 0:
        raise ValueError(f"--engine-memory-limit-gib must be >= 0, got {gib}")
    return MemoryLimit(hard_bytes=int(gib * (1 << 30))) if gib else None


def limits_from_args(args: argparse.Namespace) -> ServiceLimits:
    return ServiceLimits(max_message_bytes=args.max_message_bytes, max_constraint_bytes=args.max_constraint_bytes,
                         max_tokens_cap=args.max_tokens_cap, default_max_tokens=args.default_max_tokens,
                         shutdown_grace_s=args.shutdown_grace, drain_delay_s=args.drain_delay,
                         tool_call_syntax=args.tool_call_syntax,
                         no_reasoning=args.no_reasoning, **_think_markers(args.think_markers))


def _think_markers(text: str) -> dict[str, str]:
    if not text:
        return {}
    start, comma, end = text.partition(",")
    if not comma or not end:
        raise ValueError(f"--think-markers must be START,END (e.g. '<think>,</think>'), got {text!r}")
    return {"think_start": start, "think_end": end}


def telemetry_from_args(args: argparse.Namespace) -> Telemetry:
    from service.observability.metrics import ServiceMetrics
    metrics = None if args.no_metrics else ServiceMetrics()
    tracing = None
    if args.otlp_endpoint:
        from service.observability.tracing import Tracing
        tracing = Tracing.to_otlp(args.otlp_endpoint)
    return Telemetry(metrics, tracing)


def run_serve(args: argparse.Namespace) -> int:
    """Serve until SIGTERM / Ctrl-C; the exit code (0 after a graceful stop)."""
    from engine.frontend.mp_client import AsyncMPClient
    from service.lifecycle import serve

    log_level = getattr(logging, args.log_level)
    configure_logging(log_level, args.log_format)
    try:
        config, limits, security = engine_config_from_args(args), limits_from_args(args), security_from_args(args)
        restart_policy, memory_limit = restart_policy_from_args(args), memory_limit_from_args(args)
        batch_config = batch_config_from_args(args)
    except ValueError as e:
        print(f"formwork serve: {e}", file=sys.stderr)
        return 2

    def announce(server: GenerationServer) -> None:
        assert server.llm.info is not None
        address = f"{server.host}:{server.port}"
        tls = "-cacert CA.pem" if security.tls else "-plaintext"
        key = " -H 'authorization: Bearer KEY'" if security.api_keys else ""
        print(f"formwork: serving {server.llm.info.model_name} on {address} "
              f"(try: grpcurl {tls}{key} {address} describe formwork.v1.Generation)", flush=True)

    def announce_http(http: HttpServer) -> None:
        host = f"[{http.host}]" if ":" in http.host else http.host
        url = f"{http.scheme}://{host}:{http.port}"
        key = " -H 'Authorization: Bearer KEY'" if security.api_keys else ""
        print(f"formwork: serving the OpenAI-compatible API on {url}/v1 (try: curl{key} {url}/v1/models)", flush=True)

    client = AsyncMPClient(config, log_level=log_level, memory_limit=memory_limit, log_format=args.log_format)
    return asyncio.run(serve(client, limits, args.host, args.port, on_ready=announce, security=security,
                             http_port=None if args.no_http else args.http_port, on_http_ready=announce_http,
                             restart_policy=restart_policy, telemetry=telemetry_from_args(args),
                             batch_config=batch_config))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="formwork")
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_serve_parser(subparsers)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
