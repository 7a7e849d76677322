"""`formwork batch` and `formwork extract` up to the engine: usage errors exit 2 naming the problem,
and a job whose lines are all in the output starts no engine and writes nothing."""
from __future__ import annotations

import json

from cli.main import main


def request(custom_id: str) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}})


def test_usage_errors_exit_2_naming_the_problem(tmp_path, capsys):
    no_engine = ["--model", str(tmp_path / "no-model")]  # an engine started by mistake fails at once
    input_path = tmp_path / "in.jsonl"
    input_path.write_text(request("a") + "\n")
    assert main(["batch", str(tmp_path / "missing.jsonl"), str(tmp_path / "out.jsonl"), *no_engine]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["batch", str(input_path), str(input_path), *no_engine]) == 2
    assert "the output file must not be the input file" in capsys.readouterr().err
    not_output = tmp_path / "notes.jsonl"
    not_output.write_text("my notes\n")
    assert main(["batch", str(input_path), str(not_output), *no_engine]) == 2
    assert "line 1 is not a JSON object: it is not the output of a batch job" in capsys.readouterr().err
    assert not_output.read_text() == "my notes\n"
    assert main(["batch", str(input_path), str(tmp_path / "out.jsonl"), "--concurrency", "0", *no_engine]) == 2
    assert "--concurrency must be >= 1, got 0" in capsys.readouterr().err
    schema = tmp_path / "schema.json"
    schema.write_text("[1]")
    assert main(["extract", "--schema", str(schema), "--input", str(input_path), "--output",
                 str(tmp_path / "x.jsonl"), *no_engine]) == 2
    assert "must hold a JSON Schema object, not list" in capsys.readouterr().err
    schema.write_text("{nope")
    assert main(["extract", "--schema", str(schema), "--input", str(input_path), "--output",
                 str(tmp_path / "x.jsonl"), *no_engine]) == 2
    assert "is not valid JSON" in capsys.readouterr().err


def test_a_finished_job_starts_no_engine(tmp_path, capsys):
    input_path = tmp_path / "in.jsonl"
    input_path.write_text(f"{request('a')}\nnot json\n{request('b')}\n")
    output_path = tmp_path / "out.jsonl"
    done = ['{"custom_id":"a","response":{"status_code":200},"error":null}',
            '{"custom_id":null,"response":null,"error":{"code":"invalid_json_line"},"line":2}',
            '{"custom_id":"b","response":{"status_code":200},"error":null}']
    output_path.write_text("\n".join(done) + "\n")
    # --model names nothing that exists: starting an engine would fail
    assert main(["batch", str(input_path), str(output_path), "--model", str(tmp_path / "no-model")]) == 0
    assert "all 3 lines are already in" in capsys.readouterr().err
    assert output_path.read_text() == "\n".join(done) + "\n"
