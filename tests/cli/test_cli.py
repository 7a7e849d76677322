"""The `formwork` command line, as a user runs it."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cli.main import main


def formwork(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], input=stdin, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_generate_json_with_a_schema_from_stdin():
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    result = formwork("generate", "--prompt", "Where is the Eiffel Tower?", "--json-schema", "-", "--json",
                      "--max-tokens", "32", stdin=json.dumps(schema))
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["finish_reason"] == "stop"
    assert set(json.loads(out["text"])) == {"city"}
    assert out["usage"]["completion_tokens"] > 0 and out["usage"]["prompt_tokens"] > 0


@pytest.mark.parametrize("args, message", [
    (["--max-tokens", "0"], "max_tokens must be an integer >= 1"),
    (["--temperature", "-1"], "temperature must be >= 0"),
    (["--regex", "a", "--json-object"], "at most one constraint"),
    (["--model", "/nonexistent"], "is not a directory"),
])
def test_bad_flags_fail_with_a_message(args, message, capsys):
    # the command's own entry point in this process: a child would spend its start importing torch
    # only to reject a flag (the test above runs the command as a child, exit status included)
    try:
        status = main(["generate", "--prompt", "hi", *args])
    except SystemExit as exit:  # argparse's own refusals
        status = exit.code
    assert status == 2
    assert message in capsys.readouterr().err
