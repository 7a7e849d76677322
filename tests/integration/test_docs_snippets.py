"""The docs' runnable snippets, run against a live server so they cannot rot.

A fenced block whose info string is `sh live` or `python live` is a snippet meant to be pasted
as is while `make serve` runs: it names the server as 127.0.0.1:50051 (gRPC) or 127.0.0.1:8000
(HTTP), which this test replaces with the addresses of its own server on free ports. `sh` blocks run in bash (-e -o pipefail) from
the repository root; `python` blocks run in this interpreter (the project's .venv). A snippet
passes if it exits 0 and prints something; its output is checked further where it says what it
prints (below).
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import pytest

from live_server import REPO_ROOT, LiveServer

pytestmark = pytest.mark.slow

DOCS = ("README.md", "docs/api.md", "docs/constraints.md", "clients/python/README.md", "clients/node/README.md",
        "docs/http.md")
DEFAULT_ADDRESS = "127.0.0.1:50051"
DEFAULT_HTTP_ADDRESS = "127.0.0.1:8000"
_FENCE = re.compile(r"^```(\w+) live[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)

QUICKSTART_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
}


@dataclass(frozen=True)
class Snippet:
    path: str  # relative to the repository root
    line: int  # of the opening fence
    language: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def snippets(path: str) -> list[Snippet]:
    text = (REPO_ROOT / path).read_text()
    return [Snippet(path, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2)) for m in _FENCE.finditer(text)]


ALL = [s for path in DOCS for s in snippets(path)]


def test_the_snippets_are_found():
    readme = [s for s in ALL if s.path == "README.md"]
    # the quickstart: one grpcurl call, one Python call, one Node call (then the CLI)
    assert [s.language for s in readme[:3]] == ["sh", "python", "sh"], [s.id for s in readme]
    assert "grpcurl" in readme[0].code and "formwork_client" in readme[1].code and "node " in readme[2].code
    for path in DOCS[1:3]:
        assert any(s.path == path for s in ALL), f"{path} has no live snippet"
    for snippet in ALL:
        assert snippet.language in ("sh", "python"), snippet.id
        assert DEFAULT_ADDRESS in snippet.code or DEFAULT_HTTP_ADDRESS in snippet.code, \
            f"{snippet.id} must name the server as {DEFAULT_ADDRESS} or {DEFAULT_HTTP_ADDRESS}"


@pytest.fixture(scope="module")
def server(default_server):
    return default_server


def run(snippet: Snippet, server: LiveServer, tmp_path: Path) -> subprocess.CompletedProcess:
    assert server.http_url is not None
    code = snippet.code.replace(DEFAULT_ADDRESS, server.address).replace(
        DEFAULT_HTTP_ADDRESS, server.http_url.removeprefix("http://"))
    if snippet.language == "sh":
        command = ["bash", "-e", "-o", "pipefail", "-c", code]
    else:
        script = tmp_path / "snippet.py"
        script.write_text(code)
        command = [sys.executable, str(script)]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("snippet", ALL, ids=[s.id for s in ALL])
def test_snippet_runs(server, snippet, tmp_path):
    result = run(snippet, server, tmp_path)
    assert result.returncode == 0, f"{snippet.id} failed:\n{result.stdout}\n{result.stderr}"
    assert result.stdout.strip(), f"{snippet.id} printed nothing:\n{result.stderr}"
    if snippet.path == "README.md" and "Grace Hopper" in snippet.code:  # the quickstart's person
        jsonschema.validate(quickstart_person(snippet, result.stdout), QUICKSTART_SCHEMA)


def quickstart_person(snippet: Snippet, stdout: str) -> dict:
    if "grpcurl" in snippet.code:  # the GenerateResponse as JSON; its text is the person
        return json.loads(json.loads(stdout)["text"])
    if snippet.language == "python":  # print(dict)
        return ast.literal_eval(stdout.strip())
    return json.loads(stdout)  # node: console.log(JSON.stringify(...))
