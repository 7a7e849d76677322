"""The Node.js client's own tests (clients/node/test/, node's test runner) against a live server."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from live_server import REPO_ROOT

pytestmark = pytest.mark.slow

NODE_DIR = REPO_ROOT / "clients" / "node"


@pytest.fixture(scope="module")
def server(default_server):
    return default_server


def test_node_client(server):
    node = shutil.which("node")
    assert node, "node (>= 20) is not on PATH"
    assert (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir(), "run `make node-deps` (npm ci in clients/node)"
    result = subprocess.run([node, "--test", "--test-reporter=spec", "test/"], cwd=NODE_DIR,
                            env={**os.environ, "FORMWORK_ADDR": server.address},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
