"""Helpers of the observability tests: scraping /metrics, promtool, a real Prometheus server on
loopback (Debian's `prometheus` package; `make promtool` installs it, and `make test` runs that),
and an OTLP/HTTP receiver for traces."""
from __future__ import annotations

import http.server
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families


def scrape(http_url: str) -> str:
    response = httpx.get(f"{http_url}/metrics", timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return response.text


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value, for every sample of an exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def family_names(text: str) -> set[str]:
    """The metric families of an exposition (counters without their _total)."""
    return {family.name for family in text_string_to_metric_families(text)}


def value(parsed: dict, name: str, **labels: str) -> float:
    """One sample's value; 0 for a labelled sample never observed (prometheus_client omits it)."""
    return parsed.get((name, tuple(sorted(labels.items()))), 0.0)


def tool(name: str) -> str:
    """The path of a tool of Debian's prometheus package; a failure (not a skip) without it."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run `make promtool` (Debian's prometheus package)")
    return path


def promtool_check(text: str) -> subprocess.CompletedProcess:
    return subprocess.run([tool("promtool"), "check", "metrics"], input=text, capture_output=True, text=True,
                          timeout=60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrometheusServer:
    """A real Prometheus on a loopback port scraping one target every second; stops with `stop()`."""

    def __init__(self, target: str) -> None:
        self.directory = tempfile.TemporaryDirectory(prefix="formwork-prometheus-")
        config = Path(self.directory.name) / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                          "scrape_configs:\n  - job_name: formwork\n    static_configs:\n"
                          f"      - targets: ['{target}']\n")
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = open(Path(self.directory.name) / "prometheus.log", "w+")
        self.process = subprocess.Popen(
            [tool("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={self.directory.name}/data",
             f"--web.listen-address={self.url.removeprefix('http://')}"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def query(self, expression: str) -> list[dict]:
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": expression}, timeout=5)
        response.raise_for_status()
        return response.json()["data"]["result"]

    def wait_for(self, expression: str, timeout_s: float = 60.0) -> list[dict]:
        """The query's result once it is not empty (after the first scrapes)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                result = self.query(expression)
                if result:
                    return result
            except httpx.HTTPError:
                pass  # still starting
            time.sleep(0.5)
        self.log.seek(0)
        raise AssertionError(f"Prometheus never answered {expression!r}:\n{self.log.read()[-4000:]}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()
        self.directory.cleanup()


class OtlpCollector:
    """An OTLP/HTTP trace receiver on a loopback port: keeps each export's spans (decoded)."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
        self.spans: list = []
        self.content_types: list[str] = []
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the http.server name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                collector.content_types.append(self.headers["Content-Type"])
                for resource_spans in request.resource_spans:
                    for scope_spans in resource_spans.scope_spans:
                        collector.spans.extend(scope_spans.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, trace_id: str, count: int, timeout_s: float = 60.0) -> list:
        """The spans of a trace (hex id) once `count` have arrived (the SDK exports every few seconds)."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = [span for span in self.spans if span.trace_id.hex() == trace_id]
            if len(spans) >= count or time.monotonic() > deadline:
                return spans
            time.sleep(0.2)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
