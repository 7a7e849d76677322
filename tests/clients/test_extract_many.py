"""Client.extract_many and AsyncClient.extract_many over a fake channel: a scripted Generate that
answers each document (or fails it, or holds it until the test lets it go), so ordering, retries,
per-document errors, progress and the concurrency bound are checked without a model or a clock."""
from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterable

import grpc
import pytest

import formwork_client as fc
from formwork_client import extraction
from formwork_client.constraints import CONSTRAINT_KEY_HEADER
from formwork_client.extraction import RetryPolicy
from formwork_client.request import extract_prompt
from rpc_fakes import FakeRpcError
from service.errors import ErrorCode, ServiceError
from service.grpc.status import STATUS_DETAILS_KEY, status_proto

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}}, "required": ["name"]}
# an overloaded server's refusal carries a retry delay (a google.rpc.RetryInfo in the trailers)
QUEUE_FULL = (grpc.StatusCode.RESOURCE_EXHAUSTED,
              "the queue is full: 32 requests in flight (16 running + 16 waiting at most); retry later", 0.05)
TOO_LARGE = (grpc.StatusCode.RESOURCE_EXHAUSTED, "the request needs 900 tokens of KV cache; the engine has 512")
LOADING = (grpc.StatusCode.UNAVAILABLE, "the model is still loading; retry once health reports SERVING")
BAD_SCHEMA = (grpc.StatusCode.INVALID_ARGUMENT, "constraint.json_schema_text: json_schema does not compile")
GATE_TIMEOUT_S = 60  # only a safety net: a gate the test never opens fails the test instead of hanging it


def service_rpc_error(code: grpc.StatusCode, details: str, retry_after_s: float | None = None) -> FakeRpcError:
    """A failed call as grpc raises it, its trailers what the server sends (service/grpc/status.py)."""
    error = ServiceError(ErrorCode[code.name], details, retry_after_s=retry_after_s)
    return FakeRpcError(code, details, ((STATUS_DETAILS_KEY, status_proto(error).SerializeToString()),))


def document_text(request: fc.pb.GenerateRequest) -> str:
    return request.chat.messages[0].content.split("\n\n")[0]


class FakeGeneration:
    """Generate for a fake channel. Each document's calls follow its script, then get the answer
    {"name": <text>}: a script entry (code, message) fails that call, "length" answers with output
    cut off by max_tokens. A document in `held` waits until release(text)."""

    def __init__(self, scripts: dict[str, list] | None = None, held: Iterable[str] = ()) -> None:
        self.scripts = {text: list(outcomes) for text, outcomes in (scripts or {}).items()}
        self.calls: list[tuple[fc.pb.GenerateRequest, float | None, tuple]] = []
        self.completed: list[str] = []  # texts, in the order their calls returned
        self.cancelled: list[str] = []
        self.num_in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()
        self._gates = {text: threading.Event() for text in held}
        self._async_gates: dict[str, asyncio.Event] = {}
        self._sent: dict[str, threading.Event] = {}  # text -> set once its first call came

    def wait_sent(self, text: str) -> None:
        with self._lock:
            sent = self._sent.setdefault(text, threading.Event())
        assert sent.wait(GATE_TIMEOUT_S), f"{text!r} was never sent"

    def release(self, text: str) -> None:
        self._gates[text].set()
        if text in self._async_gates:
            self._async_gates[text].set()

    def call(self, request_bytes: bytes, timeout: float | None = None, metadata=None) -> fc.pb.GenerateResponse:
        text = self._start(request_bytes, timeout, metadata)
        try:
            if text in self._gates:
                assert self._gates[text].wait(GATE_TIMEOUT_S), f"the test never released {text!r}"
            return self._answer(text)
        finally:
            self._finish(text)

    async def call_async(self, request_bytes: bytes, timeout: float | None = None,
                         metadata=None) -> fc.pb.GenerateResponse:
        text = self._start(request_bytes, timeout, metadata)
        try:
            await asyncio.sleep(0)  # a real call always yields to the loop
            if text in self._gates:
                gate = self._async_gates.setdefault(text, asyncio.Event())
                if self._gates[text].is_set():
                    gate.set()
                await asyncio.wait_for(gate.wait(), GATE_TIMEOUT_S)
            return self._answer(text)
        except asyncio.CancelledError:
            self.cancelled.append(text)
            raise
        finally:
            self._finish(text)

    def _start(self, request_bytes: bytes, timeout: float | None, metadata) -> str:
        request = fc.pb.GenerateRequest.FromString(request_bytes)  # what went over the wire
        with self._lock:
            self.calls.append((request, timeout, tuple(metadata or ())))
            self.num_in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.num_in_flight)
            self._sent.setdefault(document_text(request), threading.Event()).set()
        return document_text(request)

    def _finish(self, text: str) -> None:
        with self._lock:
            self.num_in_flight -= 1
            self.completed.append(text)

    def _answer(self, text: str) -> fc.pb.GenerateResponse:
        with self._lock:
            script = self.scripts.get(text, [])
            outcome = script.pop(0) if script else None
        if isinstance(outcome, tuple):
            raise service_rpc_error(*outcome)
        output = json.dumps({"name": text})
        if outcome == "length":
            return fc.pb.GenerateResponse(text=output[:5], finish_reason=fc.pb.FINISH_REASON_LENGTH,
                                          usage=fc.pb.Usage(prompt_tokens=len(text), completion_tokens=3))
        return fc.pb.GenerateResponse(text=output, finish_reason=fc.pb.FINISH_REASON_STOP,
                                      usage=fc.pb.Usage(prompt_tokens=len(text), completion_tokens=7))

    def sent_texts(self) -> list[str]:
        return [document_text(request) for request, _, _ in self.calls]


class FakeChannel:
    """What the generated stub needs of a channel: Generate goes to `generation` (serialized as
    gRPC would), the other methods are not used here."""

    def __init__(self, generation: FakeGeneration, asyncio: bool = False) -> None:
        self.generation, self.asyncio = generation, asyncio

    def unary_unary(self, method, request_serializer=None, response_deserializer=None, **_):
        if method != "/formwork.v1.Generation/Generate":
            return self._unused
        call = self.generation.call_async if self.asyncio else self.generation.call
        return lambda request, timeout=None, metadata=None: call(request_serializer(request), timeout, metadata)

    def unary_stream(self, *_, **__):
        return self._unused

    @staticmethod
    def _unused(*_, **__):
        raise AssertionError("extract_many sends only Generate")


def sync_client(generation: FakeGeneration) -> fc.Client:
    return fc.Client(channel=FakeChannel(generation))


def run_async(generation: FakeGeneration, body):
    async def main():
        async with fc.AsyncClient(channel=FakeChannel(generation, asyncio=True)) as client:
            return await body(client)
    return asyncio.run(main())


# ---- the retry rule ----------------------------------------------------------------------------


def test_retry_delay_doubles_up_to_the_cap_with_full_jitter():
    policy = RetryPolicy(max_retries=6, backoff_s=0.5, max_backoff_s=3.0)
    error = fc.UnavailableError(*LOADING)
    assert [policy.delay_s(error, n, uniform=lambda: 1.0) for n in range(6)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    assert policy.delay_s(error, 2, uniform=lambda: 0.25) == 0.5  # a quarter of 2.0
    assert policy.delay_s(error, 2, uniform=lambda: 0.0) == 0.0
    assert policy.delay_s(error, 6, uniform=lambda: 1.0) is None  # max_retries spent


def test_only_unavailable_and_an_overloaded_server_are_retried():
    policy = RetryPolicy(max_retries=3)
    assert policy.delay_s(fc.UnavailableError(*LOADING), 0) is not None
    queue_full = fc.errors.from_rpc_error(service_rpc_error(*QUEUE_FULL))
    assert isinstance(queue_full, fc.ResourceExhaustedError) and queue_full.retry_after_s == 0.05
    assert policy.delay_s(queue_full, 0, uniform=lambda: 0.0) == 0.05  # never sooner than the server asked
    assert policy.delay_s(queue_full, 2, uniform=lambda: 1.0) == 2.0  # the backoff when it is longer
    assert policy.delay_s(fc.ResourceExhaustedError(*TOO_LARGE), 0) is None  # never fits: final
    assert policy.delay_s(fc.InvalidArgumentError(*BAD_SCHEMA), 0) is None
    assert policy.delay_s(fc.DeadlineExceededError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"), 0) is None


@pytest.mark.parametrize("fields, message", [
    ({"max_retries": -1}, "max_retries must be an integer >= 0, got -1"),
    ({"max_retries": 1.5}, "max_retries must be an integer >= 0, got 1.5"),
    ({"backoff_s": -0.1}, "backoff_s must be >= 0 seconds, got -0.1"),
])
def test_a_bad_retry_policy_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**fields)


# ---- the sync client ---------------------------------------------------------------------------


def test_requests_are_extract_requests_with_the_options_and_the_constraint_key():
    generation = FakeGeneration()
    with sync_client(generation) as client:
        results = client.extract_many(["Ada", "Bob"], SCHEMA, instructions="Find the name.", max_tokens=24,
                                      timeout=9.0)
    assert [r.value for r in results] == [{"name": "Ada"}, {"name": "Bob"}]
    assert sorted(generation.sent_texts()) == ["Ada", "Bob"]
    for request, timeout, metadata in generation.calls:
        text = document_text(request)
        assert request.chat.messages[0].content == extract_prompt(SCHEMA, text, "Find the name.")
        assert json.loads(request.constraint.json_schema_text) == SCHEMA
        assert request.max_tokens == 24 and request.HasField("temperature") and request.temperature == 0
        assert timeout == 9.0
        assert CONSTRAINT_KEY_HEADER in dict(metadata)


def test_results_come_in_input_order_whatever_order_the_calls_end_in():
    texts = ["first", "second", "third"]
    generation = FakeGeneration(held=texts)
    progress = []

    def on_progress(done, total, failed):  # each finished document lets the one before it go
        progress.append((done, total, failed))
        if done < len(texts):
            generation.release(texts[len(texts) - 1 - done])

    generation.release("third")
    with sync_client(generation) as client:
        results = client.extract_many(texts, SCHEMA, concurrency=3, on_progress=on_progress)
    assert generation.completed == ["third", "second", "first"]
    assert [(r.index, r.id, r.value) for r in results] == [(0, None, {"name": "first"}), (1, None, {"name": "second"}),
                                                           (2, None, {"name": "third"})]
    assert progress == [(1, 3, 0), (2, 3, 0), (3, 3, 0)]
    assert all(r.ok and r.attempts == 1 and r.usage == fc.Usage(len(r.value["name"]), 7) for r in results)


def test_as_completed_yields_each_result_as_its_call_returns():
    generation = FakeGeneration(held=["a", "b", "c"])
    with sync_client(generation) as client:
        results = client.extract_many([("id-a", "a"), ("id-b", "b"), ("id-c", "c")], SCHEMA, ordered=False)
        generation.release("b")
        assert next(results).id == "id-b"
        generation.release("c")
        assert next(results).id == "id-c"
        generation.release("a")
        assert [(r.index, r.id) for r in results] == [(0, "id-a")]


def test_unavailable_twice_then_an_answer_is_one_result_after_three_calls():
    generation = FakeGeneration({"b": [LOADING, QUEUE_FULL]})
    progress = []
    with sync_client(generation) as client:
        results = client.extract_many(["a", "b", "c"], SCHEMA, backoff_s=0,
                                      on_progress=lambda *counts: progress.append(counts))
    assert [r.attempts for r in results] == [1, 3, 1]
    assert results[1].ok and results[1].value == {"name": "b"}
    assert generation.sent_texts().count("b") == 3
    assert progress[-1] == (3, 3, 0)


def test_per_document_errors_are_results_and_the_others_are_answered():
    generation = FakeGeneration({"bad": [BAD_SCHEMA], "big": [TOO_LARGE], "down": [LOADING] * 3, "cut": ["length"]})
    progress = []
    with sync_client(generation) as client:
        results = client.extract_many(["ok", "bad", "big", "down", "cut"], SCHEMA, max_retries=2, backoff_s=0,
                                      on_progress=lambda *counts: progress.append(counts))
    ok, bad, big, down, cut = results
    assert ok.ok and ok.value == {"name": "ok"} and ok.error is None
    assert isinstance(bad.error, fc.InvalidArgumentError) and bad.error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert bad.error.message == BAD_SCHEMA[1] and bad.attempts == 1 and bad.value is None and bad.text == ""
    assert big.error.code is grpc.StatusCode.RESOURCE_EXHAUSTED and big.attempts == 1  # never fits: not retried
    assert isinstance(down.error, fc.UnavailableError) and down.attempts == 3  # 1 + max_retries
    assert isinstance(cut.error, fc.IncompleteOutputError) and cut.error.finish_reason == "FINISH_REASON_LENGTH"
    assert cut.value is None and cut.text == '{"nam' and cut.usage == fc.Usage(3, 3)
    assert progress[-1] == (5, 5, 4) and [done for done, _, _ in progress] == [1, 2, 3, 4, 5]
    assert [failed for _, _, failed in progress] == sorted(failed for _, _, failed in progress)


def test_at_most_concurrency_calls_are_in_flight():
    texts = [f"doc{i}" for i in range(6)]
    generation = FakeGeneration(held=texts)
    generation.release(texts[0])
    with sync_client(generation) as client:  # a document finishing lets the next go
        results = client.extract_many(texts, SCHEMA, concurrency=2, ordered=False,
                                      on_progress=lambda done, *_: done < 6 and generation.release(texts[done]))
        assert len(list(results)) == 6
    assert generation.max_in_flight <= 2


def test_closing_as_completed_early_sends_no_more(monkeypatch):
    monkeypatch.setattr(extraction, "_uniform", lambda: 1.0)  # every retry waits the whole backoff
    generation = FakeGeneration({"b": [LOADING] * 9})
    with sync_client(generation) as client:
        results = client.extract_many(["a", "b", "c", "d"], SCHEMA, concurrency=1, ordered=False,
                                      max_retries=8, backoff_s=3600)
        assert next(results).value == {"name": "a"}
        generation.wait_sent("b")
        results.close()  # b waits an hour to be retried: closing wakes it and stops
    assert generation.sent_texts() == ["a", "b"]


def test_documents_of_every_shape_and_bad_input_refused_before_sending():
    generation = FakeGeneration()
    with sync_client(generation) as client:
        results = client.extract_many(["plain", ("t1", "pair"), {"id": 7, "text": "mapping"}, {"text": "no id"}],
                                      SCHEMA)
        assert [(r.id, r.value["name"]) for r in results] == [(None, "plain"), ("t1", "pair"), (7, "mapping"),
                                                               (None, "no id")]
        assert client.extract_many([], SCHEMA) == []
        generation.calls.clear()
        with pytest.raises(TypeError, match=r"documents\[1\]: expected a string, an \(id, text\) pair"):
            client.extract_many(["ok", {"id": 1, "body": "x"}], SCHEMA)
        with pytest.raises(TypeError, match="documents must be a list of documents, not one str"):
            client.extract_many("one text", SCHEMA)
        with pytest.raises(ValueError, match="concurrency must be an integer >= 1, got 0"):
            client.extract_many(["x"], SCHEMA, concurrency=0)
        with pytest.raises(TypeError, match="takes no request_id"):
            client.extract_many(["x"], SCHEMA, request_id="r")
        with pytest.raises(TypeError, match="expected a formwork Constraint or a JSON Schema"):
            client.extract_many(["x"], 42)
        with pytest.raises(TypeError, match="unexpected keyword argument 'max_token'"):
            client.extract_many(["x"], SCHEMA, max_token=3)
    assert generation.calls == []


# ---- the asyncio client ------------------------------------------------------------------------


def test_async_results_in_input_order_with_retries_errors_and_progress():
    generation = FakeGeneration({"b": [LOADING, LOADING], "c": [BAD_SCHEMA]}, held=["a"])
    progress = []

    def on_progress(done, total, failed):
        progress.append((done, total, failed))
        if done == 2:
            generation.release("a")  # "a" ends last

    results = run_async(generation, lambda client: client.extract_many(
        ["a", "b", "c"], SCHEMA, backoff_s=0, on_progress=on_progress))
    assert generation.completed[-1] == "a"
    assert [(r.index, r.value, r.attempts) for r in results] == [(0, {"name": "a"}, 1), (1, {"name": "b"}, 3),
                                                                 (2, None, 1)]
    assert results[2].error.code is grpc.StatusCode.INVALID_ARGUMENT and results[2].error.message == BAD_SCHEMA[1]
    assert sorted(progress) == progress and progress[-1] == (3, 3, 1)


def test_async_as_completed_and_the_concurrency_bound():
    texts = [f"doc{i}" for i in range(5)]
    generation = FakeGeneration(held=texts)
    order = ["doc0", "doc2", "doc1", "doc3", "doc4"]  # doc2 is let go before doc1

    async def body(client):
        generation.release(order[0])
        seen = []
        async for result in client.extract_many(
                texts, SCHEMA, concurrency=3, ordered=False,
                on_progress=lambda done, *_: done < 5 and generation.release(order[done])):
            seen.append(texts[result.index])
        return seen

    assert run_async(generation, body) == order
    assert generation.max_in_flight == 3


def test_async_closing_early_cancels_the_calls_in_flight():
    generation = FakeGeneration(held=["b", "c", "d"])

    async def body(client):
        results = client.extract_many(["a", "b", "c", "d"], SCHEMA, concurrency=2, ordered=False)
        first = await anext(results)
        await results.aclose()
        return first

    assert run_async(generation, body).value == {"name": "a"}
    assert sorted(generation.cancelled) == ["b", "c"] and "d" not in generation.sent_texts()


def test_async_bad_input_is_refused_at_the_call():
    generation = FakeGeneration()

    async def body(client):
        with pytest.raises(TypeError, match=r"documents\[0\]"):
            client.extract_many([b"bytes"], SCHEMA)
        with pytest.raises(ValueError, match="concurrency"):
            client.extract_many(["x"], SCHEMA, concurrency=-1)
        return await client.extract_many([], SCHEMA)

    assert run_async(generation, body) == []
    assert generation.calls == []
