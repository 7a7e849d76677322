"""OpenAI's batch flow with the openai SDK against a live `formwork serve` on the real model:
upload, create, poll, download, a refused line in the error file, cancel, list; and a server
killed with SIGKILL mid-batch, started again on the same --data-dir, that finishes the batch with
every custom_id exactly once."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import openai
import pytest

from live_server import LiveServer

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
STARTUP_S = 900  # a shared machine may be building the CPU kernels


def chat_body(text: str, **fields) -> dict:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 8, "temperature": 0, **fields}


def request_line(custom_id: str, body: dict) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body})


def upload(client: openai.OpenAI, lines: list[str]):
    return client.files.create(file=("requests.jsonl", ("\n".join(lines) + "\n").encode()), purpose="batch")


def create(client: openai.OpenAI, lines: list[str]):
    return client.batches.create(input_file_id=upload(client, lines).id, endpoint=CHAT, completion_window="24h")


def wait_finished(client: openai.OpenAI, batch_id: str, timeout_s: float = 600.0):
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        assert time.monotonic() < deadline, f"the batch did not finish in {timeout_s} s: {batch}"
        time.sleep(0.2)


def jsonl(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def client_of(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def server(data_dir):
    live = LiveServer("--max-num-seqs", "4", "--data-dir", data_dir, startup_timeout_s=STARTUP_S)
    yield live
    assert live.stop() == 0, live.log()


@pytest.fixture(scope="module")
def client(server):
    with client_of(server) as c:
        yield c


def test_a_batch_answers_each_line_as_the_api_does(client):
    questions = {"capital": "What is the capital of France?", "color": "Name a color.", "count": "Count to three."}
    lines = [request_line(custom_id, chat_body(text)) for custom_id, text in questions.items()]
    lines.append(request_line("refused", chat_body("hi", max_tokens=-1)))
    created = create(client, lines)
    assert created.status == "in_progress" and created.request_counts.total == 4
    done = wait_finished(client, created.id)
    assert done.status == "completed", done
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 1)
    output = {line["custom_id"]: line for line in jsonl(client, done.output_file_id)}
    assert sorted(output) == sorted(questions)
    for custom_id, line in output.items():
        assert line["response"]["status_code"] == 200 and line["error"] is None
        body = line["response"]["body"]
        assert body["object"] == "chat.completion" and 0 < body["usage"]["completion_tokens"] <= 8
        # greedy: the same answer as the same body sent interactively
        interactive = client.chat.completions.create(model=body["model"], **chat_body(questions[custom_id]))
        assert body["choices"][0]["message"]["content"] == interactive.choices[0].message.content
    assert done.usage.output_tokens == sum(line["response"]["body"]["usage"]["completion_tokens"]
                                           for line in output.values())
    assert done.usage.input_tokens == sum(line["response"]["body"]["usage"]["prompt_tokens"]
                                          for line in output.values())
    errors = jsonl(client, done.error_file_id)
    assert [(line["custom_id"], line["response"]["status_code"]) for line in errors] == [("refused", 400)]
    assert "max_tokens" in errors[0]["response"]["body"]["error"]["message"]
    assert done.id in {b.id for b in client.batches.list().data}


def test_cancel_keeps_what_was_answered_and_names_the_rest(server, client):
    custom_ids = [f"r{i}" for i in range(8)]
    lines = [request_line(c, chat_body(f"Write a long story number {c}.", max_tokens=200, ignore_eos=True))
             for c in custom_ids]
    created = create(client, lines)
    cancelling = client.batches.cancel(created.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = wait_finished(client, created.id)
    assert done.status == "cancelled" and done.cancelled_at
    answered = jsonl(client, done.output_file_id)
    unrun = jsonl(client, done.error_file_id)
    assert {line["error"]["code"] for line in unrun} == {"batch_cancelled"}
    assert sorted(line["custom_id"] for line in answered + unrun) == sorted(custom_ids)
    assert done.request_counts.completed == len(answered) < len(custom_ids)
    load = server.wait_idle()  # the lines in flight were aborted, their KV blocks freed
    assert load.num_running == load.num_in_flight == 0
    assert client.batches.list(limit=1).data[0].id == created.id  # newest first


def test_a_second_server_on_the_same_data_directory_refuses_to_start(server, data_dir):
    with pytest.raises(RuntimeError, match=f"cannot serve the Batches API: {data_dir} is in use by another server"):
        LiveServer("--data-dir", data_dir, startup_timeout_s=120)


def test_a_server_killed_mid_batch_resumes_it_without_answering_a_line_twice(tmp_path):
    data_dir = str(tmp_path / "data")
    custom_ids = [f"doc-{i}" for i in range(30)]
    lines = [request_line(c, chat_body(f"Summarize document {c} in one line.", max_tokens=16)) for c in custom_ids]
    first = LiveServer("--max-num-seqs", "4", "--data-dir", data_dir, startup_timeout_s=STARTUP_S)
    try:
        client = client_of(first)
        created = create(client, lines)
        deadline = time.monotonic() + 600
        while client.batches.retrieve(created.id).request_counts.completed < 5:
            assert time.monotonic() < deadline, first.log()
            time.sleep(0.1)
        engine_pid = first.engine_pid
    finally:
        first.stop(signal.SIGKILL)
    _wait_gone(engine_pid)
    # the kill landed mid-batch: some answers are in its results file, not all
    written = (Path(data_dir) / "results" / f"{created.id}.jsonl").read_bytes()
    assert 5 <= written.count(b"\n") < 30
    second = LiveServer("--max-num-seqs", "4", "--data-dir", data_dir, startup_timeout_s=STARTUP_S)
    try:
        client = client_of(second)
        done = wait_finished(client, created.id)
        assert done.status == "completed", second.log()
        assert done.request_counts.total == done.request_counts.completed == 30
        output = jsonl(client, done.output_file_id)
        assert sorted(line["custom_id"] for line in output) == sorted(custom_ids)  # each exactly once
        assert done.error_file_id is None
    finally:
        assert second.stop() == 0, second.log()


def _wait_gone(pid: int, timeout_s: float = 60.0) -> None:
    """The killed server's engine exits once its pipe closes; wait for it (so the next server has
    the cores), and kill it if it outlives that."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split()[2] == "Z":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
