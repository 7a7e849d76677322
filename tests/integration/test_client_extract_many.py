"""Client.extract_many and AsyncClient.extract_many against a live server: a few short documents
and one too long for the model's context, which comes back as that document's error; and retries
against an address where nothing listens."""
from __future__ import annotations

import asyncio
import socket

import grpc
import jsonschema
import pytest

import formwork_client as fc
from live_server import EXTRACT_PERSON_SCHEMA as PERSON_SCHEMA

PEOPLE = [("ada", "Ada Lovelace was 36 years old."), ("bob", "Bob is a 20 year old baker."),
          ("cleo", "Cleo, aged 41, runs the library."), ("dan", "Dan turned 67 last spring."),
          ("eve", "Eve is 29 and lives in Oslo.")]
TOO_LONG = ("long", "word " * 700)  # the live server's context is 512 tokens


@pytest.fixture(scope="module")
def server(default_server):
    return default_server


def check_results(results: list[fc.ExtractionResult]) -> None:
    """The people extracted, the long document an INVALID_ARGUMENT result of its own."""
    by_id = {result.id: result for result in results}
    assert sorted(by_id) == sorted(doc_id for doc_id, _ in [*PEOPLE, TOO_LONG])
    for doc_id, _ in PEOPLE:
        result = by_id[doc_id]
        assert result.ok, result.error
        jsonschema.validate(result.value, PERSON_SCHEMA)
        assert result.usage.prompt_tokens > 0 and result.usage.completion_tokens > 0 and result.attempts == 1
    failed = by_id["long"]
    assert isinstance(failed.error, fc.InvalidArgumentError) and failed.error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "context length is 512 tokens" in failed.error.message, failed.error.message
    assert failed.value is None and failed.attempts == 1


@pytest.mark.slow
def test_extract_many_in_input_order_with_a_failed_document(server):
    documents = [*PEOPLE[:3], TOO_LONG, *PEOPLE[3:]]
    progress = []
    with fc.Client(server.address, timeout=120) as client:
        results = client.extract_many(documents, PERSON_SCHEMA, concurrency=4, max_tokens=40,
                                      on_progress=lambda *counts: progress.append(counts))
    assert [(r.index, r.id) for r in results] == [(i, doc_id) for i, (doc_id, _) in enumerate(documents)]
    check_results(results)
    assert [done for done, _, _ in progress] == [1, 2, 3, 4, 5, 6]
    assert progress[-1] == (6, 6, 1)
    load = server.wait_idle()
    assert load.num_in_flight == load.num_running == 0


@pytest.mark.slow
def test_async_extract_many_as_completed(server):
    documents = [{"id": doc_id, "text": text} for doc_id, text in [TOO_LONG, *PEOPLE]]

    async def main() -> list[fc.ExtractionResult]:
        async with fc.AsyncClient(server.address, timeout=120) as client:
            return [result async for result in client.extract_many(documents, PERSON_SCHEMA, concurrency=3,
                                                                      ordered=False, max_tokens=40)]

    results = asyncio.run(main())
    assert sorted(r.index for r in results) == list(range(6))
    check_results(results)


def test_unavailable_is_retried_then_returned():
    with socket.socket() as unserved:  # bound, never listening: connecting is refused
        unserved.bind(("127.0.0.1", 0))
        with fc.Client(f"127.0.0.1:{unserved.getsockname()[1]}", timeout=10) as client:
            results = client.extract_many(["Ada is 36.", "Bob is 20."], PERSON_SCHEMA, max_retries=2,
                                          backoff_s=0.01)
    assert [r.attempts for r in results] == [3, 3]
    assert all(isinstance(r.error, fc.UnavailableError) for r in results)
