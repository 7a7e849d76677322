"""The Node.js client's own tests (clients/node/test/, node's test runner) against live servers: the
default one, and one whose model has think markers for the reasoning tests."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from live_server import REPO_ROOT, LiveServer

pytestmark = pytest.mark.slow

NODE_DIR = REPO_ROOT / "clients" / "node"


@pytest.fixture(scope="module")
def server(default_server):
    return default_server


def run_node_tests(path: str, env: dict[str, str]) -> str:
    """The spec reporter's output of `node --test path`; fails the test unless every node test passed."""
    node = shutil.which("node")
    assert node, "node (>= 20) is not on PATH"
    assert (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir(), "run `make node-deps` (npm ci in clients/node)"
    result = subprocess.run([node, "--test", "--test-reporter=spec", path], cwd=NODE_DIR, env={**os.environ, **env},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    return result.stdout


def test_node_client(server):
    run_node_tests("test/", {"FORMWORK_ADDR": server.address})


def test_node_client_reasoning():
    thinking = LiveServer("--think-markers", "<think>,</think>", startup_timeout_s=900)
    try:
        output = run_node_tests("test/reasoning.test.js", {"FORMWORK_THINK_ADDR": thinking.address})
    finally:
        assert thinking.stop() == 0, thinking.log()
    assert "ℹ skipped 0" in output, output[-3000:]  # the suite ran: it skips itself without a server
