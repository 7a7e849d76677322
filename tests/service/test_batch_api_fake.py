"""The Files and Batches APIs with the openai SDK against the HTTP server over a fake engine core
(fast; no model run): the whole flow, the errors, cancelling, API keys, and a batch resumed by a
server started again on the same data directory. tests/integration/test_batch_api_live.py runs
them on the real model, and kills a server mid-batch."""
from __future__ import annotations

import argparse
import json
import time

import httpx
import openai
import pytest

from fake_engine_core import CRASH_SEED
from service.batch.api_config import BATCH_PRIORITY, BatchApiConfig
from service.cli import add_serve_parser, batch_config_from_args
from service.security import SecurityConfig

CHAT = "/v1/chat/completions"
MAX_FILE_BYTES = 8192


def request_line(custom_id: str, **body) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT,
                       "body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, **body}})


def jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def client_of(server, api_key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=api_key, max_retries=0, timeout=30)


def wait_finished(client: openai.OpenAI, batch_id: str, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled") or time.monotonic() > deadline:
            return batch
        time.sleep(0.05)


@pytest.fixture
def batch_config(tmp_path):
    return BatchApiConfig(data_dir=tmp_path / "data", max_file_bytes=MAX_FILE_BYTES)


def upload(client: openai.OpenAI, lines: list[str], name: str = "in.jsonl"):
    return client.files.create(file=(name, ("\n".join(lines) + "\n").encode()), purpose="batch")


def test_upload_run_and_download_a_batch(make_http_server, batch_config):
    server = make_http_server(batch_config=batch_config)
    client = client_of(server)
    uploaded = upload(client, [request_line("a"), request_line("refused", max_tokens=-1), request_line("c")])
    assert uploaded.id.startswith("file-") and uploaded.object == "file" and uploaded.purpose == "batch"
    assert uploaded.filename == "in.jsonl" and uploaded.status == "processed" and uploaded.bytes > 0
    assert client.files.retrieve(uploaded.id) == uploaded
    created = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h",
                                    metadata={"job": "fake"})
    assert created.id.startswith("batch_") and created.object == "batch" and created.endpoint == CHAT
    assert created.status == "in_progress" and created.request_counts.total == 3
    assert created.expires_at == created.created_at + 24 * 3600 and created.metadata == {"job": "fake"}
    done = wait_finished(client, created.id)
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (3, 2, 1)
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    output = jsonl(client.files.content(done.output_file_id).text)
    assert sorted(line["custom_id"] for line in output) == ["a", "c"]
    for line in output:
        assert line["response"]["status_code"] == 200 and line["error"] is None
        assert line["response"]["body"]["object"] == "chat.completion"
        assert line["response"]["body"]["choices"][0]["message"]["content"]
    assert done.usage.output_tokens == sum(line["response"]["body"]["usage"]["completion_tokens"] for line in output)
    assert done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens > 0
    errors = jsonl(client.files.content(done.error_file_id).text)
    assert [(line["custom_id"], line["response"]["status_code"]) for line in errors] == [("refused", 400)]
    assert "max_tokens" in errors[0]["response"]["body"]["error"]["message"]
    output_file = client.files.retrieve(done.output_file_id)
    assert output_file.purpose == "batch_output"
    # lists: newest first, paged with after and limit
    assert [b.id for b in client.batches.list().data] == [done.id]
    files = client.files.list()
    assert {f.id for f in files.data} == {uploaded.id, done.output_file_id, done.error_file_id}
    first_page = client.files.list(limit=1)
    assert len(first_page.data) == 1 and first_page.has_more
    assert len(list(client.files.list(limit=1))) == 3  # the SDK follows `after`
    assert client.files.list(purpose="batch").data == [uploaded]
    deleted = client.files.delete(uploaded.id)
    assert deleted.id == uploaded.id and deleted.deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)


def test_bad_uploads_and_batches_are_refused_naming_the_problem(make_http_server, batch_config):
    server = make_http_server(batch_config=batch_config)
    client = client_of(server)
    with pytest.raises(openai.BadRequestError, match="purpose: this server stores files for batches only"):
        client.files.create(file=("in.jsonl", b"{}\n"), purpose="fine-tune")
    too_big = httpx.post(f"{server.url}/v1/files", files={"file": ("big.jsonl", b"x" * (MAX_FILE_BYTES + 1))},
                         data={"purpose": "batch"})
    assert too_big.status_code == 413 and too_big.json()["error"]["param"] == "file"
    no_file = httpx.post(f"{server.url}/v1/files", data={"purpose": "batch"}, files={"other": ("x", b"1")})
    assert no_file.status_code == 400 and no_file.json()["error"]["param"] == "file"
    not_a_form = httpx.post(f"{server.url}/v1/files", json={"purpose": "batch"})
    assert not_a_form.status_code == 400 and "multipart/form-data" in not_a_form.json()["error"]["message"]
    good = upload(client, [request_line("a")])
    with pytest.raises(openai.NotFoundError, match="no file 'file-missing'"):
        client.batches.create(input_file_id="file-missing", endpoint=CHAT, completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="completion_window: must be one of 24h"):
        client.batches.create(input_file_id=good.id, endpoint=CHAT, completion_window="1h")
    with pytest.raises(openai.BadRequestError, match="endpoint: this server runs batches for"):
        client.batches.create(input_file_id=good.id, endpoint="/v1/embeddings", completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="metadata: at most 16 pairs"):
        client.batches.create(input_file_id=good.id, endpoint=CHAT, completion_window="24h",
                              metadata={str(i): "v" for i in range(17)})
    with pytest.raises(openai.BadRequestError, match="output_expires_after: not supported"):
        client.batches.create(input_file_id=good.id, endpoint=CHAT, completion_window="24h",
                              output_expires_after={"anchor": "created_at", "seconds": 3600})
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_missing")
    with pytest.raises(openai.NotFoundError):
        client.batches.cancel("batch_missing")
    with pytest.raises(openai.NotFoundError):
        client.files.content("file-missing")
    with pytest.raises(openai.BadRequestError, match="limit: must be an integer from 1 to 100"):
        client.batches.list(limit=101)
    # a malformed file: the batch fails at once, with each bad line
    bad = upload(client, [request_line("a"), "not json", request_line("a")])
    failed = client.batches.create(input_file_id=bad.id, endpoint=CHAT, completion_window="24h")
    assert failed.status == "failed" and failed.failed_at and failed.output_file_id is None
    assert [(e.code, e.line) for e in failed.errors.data] == [("invalid_json_line", 2), ("duplicate_custom_id", 3)]


def test_cancel_stops_a_batch_and_keeps_its_answers(make_http_server, batch_config):
    server = make_http_server(batch_config=batch_config, step_s=0.02)
    client = client_of(server)
    # each line takes hundreds of steps: the batch is still running when the cancel comes; a line's
    # own priority does not jump the queue
    lines = [request_line(f"r{i}", max_tokens=400, ignore_eos=True, formwork={"priority": -5}) for i in range(8)]
    created = client.batches.create(input_file_id=upload(client, lines).id, endpoint=CHAT,
                                    completion_window="24h")
    deadline = time.monotonic() + 30
    while len(in_engine := list(server.core.requests.values())) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(in_engine) == 4  # --batch-concurrency lines at once
    assert {r.request.priority for r in in_engine} == {BATCH_PRIORITY}  # below interactive requests' 0
    cancelling = client.batches.cancel(created.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    done = wait_finished(client, created.id)
    assert done.status == "cancelled" and done.cancelled_at, done
    answered = jsonl(client.files.content(done.output_file_id).text) if done.output_file_id else []
    unrun = jsonl(client.files.content(done.error_file_id).text)
    assert sorted(line["custom_id"] for line in answered + unrun) == sorted(f"r{i}" for i in range(8))
    assert {line["error"]["code"] for line in unrun} == {"batch_cancelled"} and len(unrun) >= 4
    assert server.wait_idle()  # the lines in flight were aborted
    with pytest.raises(openai.BadRequestError, match="only a validating or in_progress batch"):
        client.batches.cancel(wait_finished(client, upload_and_run(client)).id)


def upload_and_run(client: openai.OpenAI) -> str:
    return client.batches.create(input_file_id=upload(client, [request_line("x")]).id, endpoint=CHAT,
                                 completion_window="24h").id


def test_the_files_and_batches_apis_need_a_key_when_keys_are_set(make_http_server, batch_config):
    server = make_http_server(batch_config=batch_config, security=SecurityConfig(api_keys=("key-1",)))
    for method, path in (("GET", "/v1/files"), ("POST", "/v1/files"), ("GET", "/v1/batches"),
                         ("POST", "/v1/batches"), ("GET", "/v1/files/file-x/content")):
        assert httpx.request(method, f"{server.url}{path}").status_code == 401
    client = client_of(server, "key-1")
    assert client.files.list().data == []


def test_a_server_started_again_on_the_same_data_directory_resumes_the_batch(make_http_server, batch_config):
    first = make_http_server(batch_config=batch_config, step_s=0.01)
    client = client_of(first)
    custom_ids = [f"r{i}" for i in range(12)]
    lines = [request_line(c, max_tokens=40, ignore_eos=True) for c in custom_ids]
    created = client.batches.create(input_file_id=upload(client, lines).id, endpoint=CHAT, completion_window="24h")
    while client.batches.retrieve(created.id).request_counts.completed < 2:
        time.sleep(0.02)
    first.close()  # mid-batch: its lines in flight are aborted
    second = make_http_server(batch_config=batch_config, step_s=0.01)
    client = client_of(second)
    done = wait_finished(client, created.id)
    assert done.status == "completed" and done.request_counts.completed == 12
    output = jsonl(client.files.content(done.output_file_id).text)
    assert sorted(line["custom_id"] for line in output) == sorted(custom_ids)  # each exactly once


def test_serve_options_give_the_batch_settings(tmp_path, monkeypatch):
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())

    def config(*argv: str):
        return batch_config_from_args(parser.parse_args(["serve", *argv]))

    monkeypatch.setenv("FORMWORK_CACHE", str(tmp_path / "cache"))
    default = config()
    assert default.data_dir == tmp_path / "cache" / "data" and not default.required  # held: serve without it
    given = config("--data-dir", str(tmp_path / "mine"), "--batch-concurrency", "2", "--max-file-bytes", "1000")
    assert given.data_dir == tmp_path / "mine" and given.required
    assert (given.max_concurrent_lines, given.max_file_bytes) == (2, 1000)
    assert config("--no-batches") is None and config("--no-http") is None
    with pytest.raises(ValueError, match="max_concurrent_lines must be >= 1"):
        config("--batch-concurrency", "0")


def test_a_line_that_kills_the_engine_fails_after_two_deaths_and_the_others_are_answered(make_http_server,
                                                                                          batch_config):
    server = make_http_server(batch_config=batch_config)
    client = client_of(server)
    custom_ids = [f"ok{i}" for i in range(6)]
    lines = [request_line(c) for c in custom_ids] + [request_line("poison", seed=CRASH_SEED)]
    created = client.batches.create(input_file_id=upload(client, lines).id, endpoint=CHAT, completion_window="24h")
    done = wait_finished(client, created.id, timeout_s=120)
    assert done.status == "completed" and done.request_counts.completed == 6, done
    assert sorted(line["custom_id"] for line in jsonl(client.files.content(done.output_file_id).text)) == custom_ids
    [error] = jsonl(client.files.content(done.error_file_id).text)
    assert error["custom_id"] == "poison" and error["response"]["status_code"] == 500
    assert error["response"]["body"]["error"]["message"] == ("the engine failed 2 times while this request ran; it "
                                                             "is not sent again")
    deadline = time.monotonic() + 30
    while httpx.get(f"{server.url}/health").status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.num_cores_built == 3  # two deaths, two restarts: the engine serves again
    assert httpx.get(f"{server.url}/health").status_code == 200
