"""A `formwork serve` subprocess on a free loopback port, for the serving benchmark.

The server binds port 0 and announces the address it got ("serving ... on 127.0.0.1:PORT"), so
there is no race for a port. Its log goes to a file that errors quote.
"""
from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_READY = re.compile(r"serving .* on (\S+:\d+)")
_HTTP_READY = re.compile(r"serving the OpenAI-compatible API on (\S+)/v1")
REPO_ROOT = Path(__file__).resolve().parent.parent


class ServerProcess:
    """Start with `ServerProcess(args)`; `address` is set once the model is loaded and warm."""

    def __init__(self, args: list[str], startup_timeout_s: float = 300.0, http: bool = False) -> None:
        self.log_file = tempfile.NamedTemporaryFile("w+", prefix="formwork-bench-serve-", suffix=".log", delete=False)
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1"}
        self.args = args
        self.process = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--host", "127.0.0.1", "--port", "0",
             *(("--http-port", "0") if http else ("--no-http",)), "--log-level", "WARNING", *args],
            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=self.log_file, text=True)
        # the HTTP API's base URL (http://127.0.0.1:PORT), announced right after gRPC's address
        self.http_url: str | None = None
        self.address = self._wait_ready(startup_timeout_s, http)

    def _wait_ready(self, timeout_s: float, http: bool) -> str:
        """The gRPC address, once it (and the HTTP URL, with `http`) is announced."""
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        selector = selectors.DefaultSelector()
        selector.register(self.process.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(timeout=1.0):
                continue
            line = self.process.stdout.readline()
            if not line:
                break  # exited
            match = _READY.search(line)
            if match:
                if http:  # printed right after gRPC's line, maybe already in the read buffer: no select
                    for line in self.process.stdout:
                        if http_match := _HTTP_READY.search(line):
                            self.http_url = http_match.group(1)
                            break
                if self.http_url is not None or not http:
                    return match.group(1)
                break
        self.process.kill()
        self.process.wait(10)
        raise RuntimeError(f"the server did not become ready in time:\n{self.log()}")

    def log(self) -> str:
        return Path(self.log_file.name).read_text(errors="replace")[-4000:]

    def stop(self, timeout_s: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(10)
        finally:
            if self.process.stdout is not None:
                self.process.stdout.close()
            self.log_file.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
