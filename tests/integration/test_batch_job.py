"""`formwork batch` and `formwork extract` on the real model: a mixed file answered in process (every
kind of line, good and bad), the same file through a running server's gRPC and HTTP APIs with the
same answers, and a job killed with SIGKILL, resumed after a torn line, with every custom_id
exactly once and the answers of an uninterrupted greedy run."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from live_server import PERSON_SCHEMA, REPO_ROOT

pytestmark = pytest.mark.slow

ENGINE_ARGS = ("--max-model-len", "512", "--num-blocks", "256", "--threads", "2", "--max-num-seqs", "4")


def line(custom_id: str, url: str, body: dict) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


MIXED = [
    line("chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Name a color."}],
                                          "max_tokens": 8, "temperature": 0}),
    line("completion", "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}),
    line("response", "/v1/responses", {"input": "Say hi.", "max_output_tokens": 8, "temperature": 0}),
    line("person", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Alice is 30. As JSON."}], "max_tokens": 40, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}}}),
    line("bad-schema", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 8,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}}),
    "this line is not JSON",
    line("embeddings", "/v1/embeddings", {"input": "x"}),
    line("streamed", "/v1/completions", {"prompt": "x", "stream": True}),
    line("chat", "/v1/completions", {"prompt": "a duplicate custom_id", "max_tokens": 4}),
]


def run_batch(input_path: Path, output_path: Path, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", "batch", str(input_path), str(output_path), *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})


def by_key(path: Path) -> dict:
    records = [json.loads(text) for text in path.read_text().splitlines()]
    keyed = {r["custom_id"] if r["custom_id"] is not None else r["line"]: r for r in records}
    assert len(keyed) == len(records), "a key written twice"
    return keyed


def answer_text(record: dict) -> str:
    body = record["response"]["body"]
    if body["object"] == "response":
        return body["output"][0]["content"][0]["text"]
    choice = body["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def test_a_mixed_file_in_process_and_through_a_servers_apis(tmp_path, default_server):
    input_path = tmp_path / "in.jsonl"
    input_path.write_text("\n".join(MIXED) + "\n")
    done = run_batch(input_path, tmp_path / "out.jsonl", *ENGINE_ARGS)
    assert done.returncode == 0, done.stderr
    assert "9 of 9 lines written (4 answered, 5 failed)" in done.stderr
    out = by_key(tmp_path / "out.jsonl")
    assert set(out) == {"chat", "completion", "response", "person", "bad-schema", 6, "embeddings", "streamed", 9}
    for key in ("chat", "completion", "response", "person"):
        assert out[key]["response"]["status_code"] == 200 and out[key]["error"] is None
        assert out[key]["id"].startswith("batch_req_")
    assert set(json.loads(answer_text(out["person"]))) == {"name", "age"}
    refused = out["bad-schema"]["response"]
    assert refused["status_code"] == 400
    assert refused["body"]["error"]["param"] == "response_format.json_schema.schema"
    assert [out[k]["error"]["code"] for k in (6, "embeddings", "streamed", 9)] == [
        "invalid_json_line", "invalid_url", "stream_not_supported", "duplicate_custom_id"]

    # the same file through the server: the same greedy answers, the same refusals
    for address in (default_server.address, default_server.http_url):
        output_path = tmp_path / f"out-{len(list(tmp_path.iterdir()))}.jsonl"
        through = run_batch(input_path, output_path, "--address", address)
        assert through.returncode == 0, through.stderr
        other = by_key(output_path)
        assert set(other) == set(out)
        for key in ("chat", "completion", "response", "person"):
            assert answer_text(other[key]) == answer_text(out[key]), address
        assert other["bad-schema"]["response"] == {**refused, "request_id": other["bad-schema"]["response"]["request_id"]}
    assert default_server.wait_idle().num_in_flight == 0


def test_a_job_killed_with_sigkill_resumes_every_line_exactly_once(tmp_path):
    prompts = [f"Write a word that rhymes with the number {i}." for i in range(40)]
    input_path = tmp_path / "in.jsonl"
    input_path.write_text("".join(line(f"c{i}", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": p}], "max_tokens": 24, "temperature": 0}) + "\n"
        for i, p in enumerate(prompts)))
    args = (*ENGINE_ARGS, "--concurrency", "2")

    reference = run_batch(input_path, tmp_path / "reference.jsonl", *args)
    assert reference.returncode == 0, reference.stderr
    expected = {key: answer_text(r) for key, r in by_key(tmp_path / "reference.jsonl").items()}
    assert len(expected) == 40

    output_path = tmp_path / "out.jsonl"
    job = subprocess.Popen([sys.executable, "-m", "cli.main", "batch", str(input_path), str(output_path), *args],
                           cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    try:
        deadline = time.monotonic() + 600
        while (not output_path.exists() or output_path.read_bytes().count(b"\n") < 3) and job.poll() is None:
            assert time.monotonic() < deadline, "no line written"
            time.sleep(0.005)
    finally:
        os.killpg(job.pid, signal.SIGKILL)  # the job and its engine process, as kill -9 leaves them
        job.wait(60)
    assert job.returncode == -signal.SIGKILL, "the job ended before it was killed"
    num_written = output_path.read_bytes().count(b"\n")
    assert 3 <= num_written < 40
    with output_path.open("ab") as f:  # a line cut by the kill, as a write interrupted half way leaves it
        f.write(b'{"id":"batch_req_torn","custom_id":"c39","response":{"status_code":2')

    resumed = run_batch(input_path, output_path, *args)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{num_written} lines already in the output, {40 - num_written} to run" in resumed.stderr
    records = [json.loads(text) for text in output_path.read_text().splitlines()]
    assert sorted(r["custom_id"] for r in records) == sorted(expected)  # each exactly once
    assert {r["custom_id"]: answer_text(r) for r in records} == expected
    again = run_batch(input_path, output_path, *args)
    assert again.returncode == 0 and "all 40 lines are already in" in again.stderr
    assert output_path.read_text().count("\n") == 40


def test_extract_over_a_folder_of_documents(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "alice.txt").write_text("Alice Smith is 34 years old.")
    (folder / "bob.txt").write_text("Bob, aged 51, lives in Berlin.")
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(PERSON_SCHEMA))
    output_path = tmp_path / "people.jsonl"
    done = subprocess.run([sys.executable, "-m", "cli.main", "extract", "--schema", str(schema), "--input",
                           str(folder), "--output", str(output_path), "--max-tokens", "48", *ENGINE_ARGS],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    records = {r["id"]: r for r in map(json.loads, output_path.read_text().splitlines())}
    assert set(records) == {"alice", "bob"}
    for record in records.values():
        assert set(record["object"]) == {"name", "age"}, record
        assert record["usage"]["prompt_tokens"] > 0 and record["usage"]["completion_tokens"] > 0
    missing = subprocess.run([sys.executable, "-m", "cli.main", "extract", "--schema", str(tmp_path / "none.json"),
                              "--input", str(folder), "--output", str(output_path)],
                             cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "cannot read" in missing.stderr
