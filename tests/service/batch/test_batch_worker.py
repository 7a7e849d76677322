"""The server's batch worker over a scripted Executor: validation, the split into output and error
files, resuming from a results file (a torn last line included), cancelling and expiry."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from service.batch.api_config import BatchApiConfig
from service.batch.batch_status import BatchStatus
from service.batch.executor import Executor
from service.batch.lines import answer_line
from service.batch.store import BatchStore, RequestCounts
from service.batch.worker import BatchWorker

CHAT = "/v1/chat/completions"
DAY_S = 24 * 3600


class ScriptedExecutor(Executor):
    """Answers 200 with the body's text echoed; a body with "status" gets that status. With `gate`,
    every call waits for it (cancelled calls are counted)."""

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.gate = gate
        self.calls: list[str] = []
        self.num_cancelled = 0

    async def execute(self, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.calls.append(body["messages"][0]["content"])
        if self.gate is not None:
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.num_cancelled += 1
                raise
        status = body.get("status", 200)
        if status != 200:
            return status, {"error": {"message": "refused", "type": "invalid_request_error", "param": None,
                                      "code": None}}
        return 200, {"object": "chat.completion", "echo": body["messages"][0]["content"],
                     "usage": {"prompt_tokens": 5, "completion_tokens": 2,
                               "prompt_tokens_details": {"cached_tokens": 1}}}


def request_line(custom_id: str, url: str = CHAT, **body) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url,
                       "body": {"messages": [{"role": "user", "content": custom_id}], **body}})


def jsonl(store: BatchStore, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in store.file_path(file_id).read_text().splitlines()]


async def run_until(store: BatchStore, worker: BatchWorker, batch_id: str, done, timeout_s: float = 20.0):
    async def poll():
        while not done(store.batch(batch_id)):
            await asyncio.sleep(0.01)
    await asyncio.wait_for(poll(), timeout_s)
    return store.batch(batch_id)


@pytest.fixture
def store(tmp_path):
    opened = BatchStore(tmp_path)
    yield opened
    opened.close()


def make_batch(store: BatchStore, lines: list[str], now: int | None = None):
    upload = store.add_file(("\n".join(lines) + "\n").encode(), "in.jsonl", "batch")
    return store.add_batch(CHAT, upload.id, "24h", DAY_S, None, now=now)


def config(store: BatchStore, **kwargs) -> BatchApiConfig:
    return BatchApiConfig(data_dir=store.data_dir, **kwargs)


def run_to_the_end(store: BatchStore, executor: Executor, batch_id: str):
    """A started worker over `executor` until batch `batch_id` is finished; the batch then."""
    async def scenario():
        worker = BatchWorker(store, executor, config(store), lambda: True)
        worker.start()
        try:
            return await run_until(store, worker, batch_id, lambda b: b.status.is_finished)
        finally:
            await worker.stop()
    return asyncio.run(scenario())


def test_answers_go_to_the_output_file_and_refusals_to_the_error_file(store):
    batch = make_batch(store, [request_line("a"), request_line("bad", status=400), request_line("c")])
    executor = ScriptedExecutor()

    async def scenario():
        worker = BatchWorker(store, executor, config(store, max_concurrent_lines=2), lambda: True)
        validated = await worker.validate(batch)
        assert validated.status is BatchStatus.IN_PROGRESS and validated.request_counts.total == 3
        worker.start()
        try:
            done = await run_until(store, worker, batch.id, lambda b: b.status.is_finished)
            with pytest.raises(ValueError, match="is completed; only a validating or in_progress"):
                worker.cancel(batch.id)
            with pytest.raises(KeyError):
                worker.cancel("batch_unknown")
            return done
        finally:
            await worker.stop()

    done = asyncio.run(scenario())
    assert done.status is BatchStatus.COMPLETED and done.request_counts == RequestCounts(3, 2, 1)
    assert {"in_progress_at", "finalizing_at", "completed_at"} <= done.timestamps.keys()
    output, errors = jsonl(store, done.output_file_id), jsonl(store, done.error_file_id)
    assert sorted(line["custom_id"] for line in output) == ["a", "c"]
    assert all(line["response"]["status_code"] == 200 and line["error"] is None for line in output)
    assert [(line["custom_id"], line["response"]["status_code"]) for line in errors] == [("bad", 400)]
    assert sorted(executor.calls) == ["a", "bad", "c"]
    assert not store.results_path(batch.id).exists()
    assert done.usage == {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 2}, "output_tokens": 4,
                          "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 14}


def test_a_file_with_a_bad_line_fails_validation_with_each_problem(store):
    batch = make_batch(store, [request_line("a"), "{not json", request_line("b", url="/v1/completions"),
                               request_line("a")])

    async def scenario():
        return await BatchWorker(store, ScriptedExecutor(), config(store), lambda: True).validate(batch)

    failed = asyncio.run(scenario())
    assert failed.status is BatchStatus.FAILED and "failed_at" in failed.timestamps
    assert [(e["code"], e["line"]) for e in failed.errors] == [
        ("invalid_json_line", 2), ("mismatched_endpoint", 3), ("duplicate_custom_id", 4)]
    assert failed.errors[1]["param"] == "url" and "/v1/chat/completions" in failed.errors[1]["message"]


def test_an_empty_file_and_one_over_the_request_limit_fail(store):
    empty = make_batch(store, [""])
    many = make_batch(store, [request_line(f"r{i}") for i in range(3)])

    async def scenario():
        worker = BatchWorker(store, ScriptedExecutor(), config(store, max_requests=2), lambda: True)
        return await worker.validate(empty), await worker.validate(many)

    empty_failed, many_failed = asyncio.run(scenario())
    assert [e["code"] for e in empty_failed.errors] == ["empty_file"]
    assert [e["code"] for e in many_failed.errors] == ["too_many_requests"]


def test_a_resumed_batch_skips_the_answered_lines_and_redoes_a_torn_one(store):
    custom_ids = [f"r{i}" for i in range(6)]
    batch = make_batch(store, [request_line(c) for c in custom_ids])
    store.move(batch.id, BatchStatus.IN_PROGRESS, num_total=6)
    # a server killed mid-batch: two answers written whole, the third torn
    answered = [json.dumps(answer_line(c, 200, {"echo": c})) + "\n" for c in ("r0", "r3")]
    store.results_path(batch.id).write_text("".join(answered) + json.dumps(answer_line("r1", 200, {}))[:25])
    executor = ScriptedExecutor()
    done = run_to_the_end(store, executor, batch.id)
    assert sorted(executor.calls) == ["r1", "r2", "r4", "r5"]
    assert done.status is BatchStatus.COMPLETED and done.request_counts == RequestCounts(6, 6, 0)
    output = jsonl(store, done.output_file_id)
    assert sorted(line["custom_id"] for line in output) == custom_ids


def test_cancelling_aborts_the_lines_in_flight_and_keeps_the_answers(store):
    batch = make_batch(store, [request_line(f"r{i}") for i in range(6)])
    gate = asyncio.Event()

    async def scenario():
        executor = ScriptedExecutor(gate)
        worker = BatchWorker(store, executor, config(store, max_concurrent_lines=2), lambda: True)
        worker.start()
        try:
            await worker.validate(batch)
            worker.wake()
            while len(executor.calls) < 2:  # both lines in flight, held at the gate
                await asyncio.sleep(0.01)
            cancelling = worker.cancel(batch.id)
            assert cancelling.status is BatchStatus.CANCELLING and "cancelling_at" in cancelling.timestamps
            assert worker.cancel(batch.id).status is BatchStatus.CANCELLING  # again: answered as it is
            done = await run_until(store, worker, batch.id, lambda b: b.status.is_finished)
            assert worker.cancel(batch.id).status is BatchStatus.CANCELLED
            return executor, done
        finally:
            await worker.stop()

    executor, done = asyncio.run(scenario())
    assert executor.num_cancelled == 2 and len(executor.calls) == 2
    assert done.status is BatchStatus.CANCELLED and done.output_file_id is None
    assert done.request_counts == RequestCounts(6, 0, 0)
    errors = jsonl(store, done.error_file_id)
    assert sorted(line["custom_id"] for line in errors) == [f"r{i}" for i in range(6)]
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}


def test_a_batch_past_its_window_expires_with_what_it_answered(store):
    batch = make_batch(store, [request_line("r0"), request_line("r1")], now=1000)  # expired long ago
    store.move(batch.id, BatchStatus.IN_PROGRESS, num_total=2)
    store.results_path(batch.id).write_text(json.dumps(answer_line("r0", 200, {"echo": "r0"})) + "\n")
    executor = ScriptedExecutor(asyncio.Event())
    done = run_to_the_end(store, executor, batch.id)
    assert done.status is BatchStatus.EXPIRED and "expired_at" in done.timestamps
    assert [line["custom_id"] for line in jsonl(store, done.output_file_id)] == ["r0"]
    errors = jsonl(store, done.error_file_id)
    assert [(line["custom_id"], line["error"]["code"]) for line in errors] == [("r1", "batch_expired")]
    assert done.request_counts == RequestCounts(2, 1, 0)


def test_a_batch_waits_for_the_engine_before_it_runs(store):
    batch = make_batch(store, [request_line("r0")])
    ready = asyncio.Event()
    executor = ScriptedExecutor()

    async def scenario():
        worker = BatchWorker(store, executor, config(store), ready.is_set, ready_poll_s=0.01)
        worker.start()
        try:
            await run_until(store, worker, batch.id, lambda b: b.status is BatchStatus.IN_PROGRESS)
            for _ in range(20):
                await asyncio.sleep(0)
            assert executor.calls == []  # the engine is not serving yet
            ready.set()
            return await run_until(store, worker, batch.id, lambda b: b.status.is_finished)
        finally:
            await worker.stop()

    assert asyncio.run(scenario()).status is BatchStatus.COMPLETED
    assert executor.calls == ["r0"]


@pytest.mark.parametrize(("left_in", "ends_in", "error_codes"), [
    (BatchStatus.FINALIZING, BatchStatus.COMPLETED, []),
    (BatchStatus.CANCELLING, BatchStatus.CANCELLED, ["batch_cancelled"]),
])
def test_a_batch_left_finalizing_or_cancelling_by_a_killed_server_is_finished(store, left_in, ends_in, error_codes):
    batch = make_batch(store, [request_line("r0"), request_line("r1")])
    store.move(batch.id, BatchStatus.IN_PROGRESS, num_total=2)
    store.move(batch.id, left_in)
    store.results_path(batch.id).write_text(json.dumps(answer_line("r0", 200, {"echo": "r0"})) + "\n")
    if left_in is BatchStatus.FINALIZING:  # every line was answered before the kill
        with open(store.results_path(batch.id), "a") as results:
            results.write(json.dumps(answer_line("r1", 200, {"echo": "r1"})) + "\n")
    executor = ScriptedExecutor()
    done = run_to_the_end(store, executor, batch.id)
    assert done.status is ends_in and executor.calls == []
    assert [line["error"]["code"] for line in jsonl(store, done.error_file_id)] == error_codes
    assert "r0" in {line["custom_id"] for line in jsonl(store, done.output_file_id)}
