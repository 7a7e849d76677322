"""The job runner over a fake executor: every line written once, in-flight requests bounded,
"not now" answers retried and never written, a stopped job resumed, tokens counted."""
from __future__ import annotations

import asyncio
import io
import json

from service.batch.executor import Executor, ExecutorUnavailable
from service.batch.lines import read_lines
from service.batch.output_file import OutputFile
from service.batch.progress import Progress
from service.batch.runner import BATCH_RECORDS, JobRunner, generated_tokens


class FakeExecutor(Executor):
    """Answers `{"echo": body}` with 2 tokens a request; refuses the custom_ids in `refuse` with
    `refusal` (a status, or ExecutorUnavailable) `refuse_times` times each."""

    def __init__(self, refusal: int | None = None, refuse: frozenset[str] = frozenset(), refuse_times: int = 1):
        self.refusal, self.refuse, self.refuse_times = refusal, refuse, refuse_times
        self.calls: list[str] = []
        self.in_flight = self.max_in_flight = 0

    async def execute(self, url, body):
        custom_id = body["messages"][0]["content"]
        self.calls.append(custom_id)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0)  # let the other workers start theirs
            if custom_id in self.refuse and self.calls.count(custom_id) <= self.refuse_times:
                if self.refusal is None:
                    raise ExecutorUnavailable("connection refused")
                return self.refusal, {"error": {"message": "busy"}}
            if custom_id == "bad":
                return 400, {"error": {"message": "no"}}
            return 200, {"echo": body, "usage": {"completion_tokens": 2}}
        finally:
            self.in_flight -= 1


def input_lines(ids: list[str]) -> list[bytes]:
    return [json.dumps({"custom_id": i, "method": "POST", "url": "/v1/chat/completions",
                        "body": {"messages": [{"role": "user", "content": i}]}}).encode() for i in ids]


def run(path, raw_lines, executor, concurrency=3, max_retries=2):
    async def go():
        with OutputFile(path, BATCH_RECORDS.key_of) as output:
            runner = JobRunner(executor, output, Progress(io.StringIO(), is_tty=False), concurrency=concurrency,
                               max_retries=max_retries, retry_backoff_s=0.0)
            return await runner.run(read_lines(raw_lines))
    return asyncio.run(go())


def written(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_line_is_written_once_with_bounded_concurrency(tmp_path):
    path = tmp_path / "out.jsonl"
    ids = [f"c{i}" for i in range(20)] + ["bad"]
    executor = FakeExecutor()
    result = run(path, input_lines(ids) + [b"oops"] + input_lines(["c3"]), executor, concurrency=4)
    assert result.stopped is None
    counts = result.counts
    assert (counts.num_total, counts.num_done, counts.num_failed, counts.num_tokens) == (23, 23, 3, 40)
    assert executor.max_in_flight == 4 and sorted(executor.calls) == sorted(ids)
    lines = written(path)
    assert sorted(line["custom_id"] for line in lines if line["custom_id"]) == sorted(ids)
    by_id = {line["custom_id"]: line for line in lines}
    assert by_id["c7"]["response"]["body"]["echo"]["messages"][0]["content"] == "c7"
    assert by_id["bad"]["response"]["status_code"] == 400
    assert {line["error"]["code"] for line in lines if line["custom_id"] is None} == {"invalid_json_line",
                                                                                      "duplicate_custom_id"}
    # run again: nothing to do, nothing sent
    again = FakeExecutor()
    assert run(path, input_lines(ids) + [b"oops"] + input_lines(["c3"]), again).counts.num_skipped == 23
    assert again.calls == [] and len(written(path)) == 23


def test_not_now_answers_are_retried_and_never_written(tmp_path):
    path = tmp_path / "out.jsonl"
    for refusal in (503, 429, None):
        path.unlink(missing_ok=True)
        executor = FakeExecutor(refusal, frozenset({"c1"}), refuse_times=2)
        result = run(path, input_lines(["c0", "c1", "c2"]), executor, max_retries=2)
        assert result.stopped is None and executor.calls.count("c1") == 3
        assert [line["response"]["status_code"] for line in written(path)] == [200, 200, 200]


def test_a_job_stopped_by_an_unavailable_executor_resumes_where_it_stopped(tmp_path):
    path = tmp_path / "out.jsonl"
    ids = [f"c{i}" for i in range(10)]
    stopped = run(path, input_lines(ids), FakeExecutor(None, frozenset({"c5"}), refuse_times=99), max_retries=1)
    assert stopped.stopped is not None and "'c5' was refused 2 times, last with connection refused" in stopped.stopped
    assert "c5" not in {line["custom_id"] for line in written(path)}
    executor = FakeExecutor()
    resumed = run(path, input_lines(ids), executor)
    assert resumed.stopped is None and "c5" in executor.calls
    assert resumed.counts.num_skipped + resumed.counts.num_done == 10
    assert sorted(line["custom_id"] for line in written(path)) == sorted(ids)


def test_a_job_cancelled_mid_way_resumes_with_every_line_once(tmp_path):
    path = tmp_path / "out.jsonl"
    ids = [f"c{i}" for i in range(30)]

    async def cancelled_after_some_lines():
        executor = FakeExecutor()
        with OutputFile(path, BATCH_RECORDS.key_of) as output:
            runner = JobRunner(executor, output, Progress(io.StringIO(), is_tty=False), concurrency=4)
            task = asyncio.create_task(runner.run(read_lines(input_lines(ids))))
            while len(output.done) < 10:
                await asyncio.sleep(0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(cancelled_after_some_lines())
    first = len(written(path))
    assert 10 <= first < 30
    run(path, input_lines(ids), FakeExecutor())
    assert sorted(line["custom_id"] for line in written(path)) == sorted(ids)


def test_generated_tokens_reads_chat_completion_and_responses_usage():
    assert generated_tokens({"usage": {"completion_tokens": 7}}) == 7
    assert generated_tokens({"usage": {"output_tokens": 5, "input_tokens": 9}}) == 5
    assert generated_tokens({"error": {"message": "no"}}) == 0
