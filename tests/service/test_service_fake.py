"""The server's behaviour in every request state, against a fake engine core (fast; no model run).

The gRPC server runs in-process (GenerationServer on its own event loop thread) over an
InprocClient driving tests/support/fake_engine_core.FakeEngineCore; the last tests run the fake core in a
real child process through AsyncMPClient to check process death and start-up failure.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from engine.config import EngineConfig
from engine.frontend.core_client import EngineDeadError
from engine.frontend.mp_client import AsyncMPClient
from engine.protocol import EngineCoreRequest
from engine.sampling_params import SamplingParams
from fake_engine_core import CRASH_SEED, fake_config, make_fake_core
from inproc_server import NOT_SERVING, SERVING, InprocServer, idle, long_request
from live_server import error_of, field_violations
from service._gen.formwork.v1 import generation_pb2 as pb
from formwork_client.errors import from_rpc_error
from service.errors import OVERLOADED_RETRY_AFTER_S
from service.limits import ServiceLimits
from service.supervisor import RestartPolicy


@pytest.fixture
def make_server():
    servers = []

    def make(**kwargs) -> InprocServer:
        servers.append(InprocServer(**kwargs))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


# ---- start-up and health ----------------------------------------------------------------------


def test_not_serving_and_unavailable_until_loaded_and_warm(make_server):
    server = make_server(wait_ready=False, startup_s=1.0)
    assert server.health_status() == NOT_SERVING
    error = error_of(server.stub.Generate, pb.GenerateRequest(prompt="hi"), timeout=5)
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "loading" in error.details()
    server.run(server.server.wait_started())
    assert server.health_status() == SERVING
    assert server.stub.Generate(pb.GenerateRequest(prompt="hi", max_tokens=3), timeout=5).usage.completion_tokens == 3
    assert server.core.num_steps >= 4 + 3  # the warm-up (4 tokens) ran before this request


def test_reflection_v1alpha_and_v1(make_server):
    server = make_server()
    names = {"formwork.v1.Generation", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
             "grpc.reflection.v1.ServerReflection"}
    v1alpha = reflection_pb2_grpc.ServerReflectionStub(server.channel)
    # v1 has the same messages under another package: call it with the v1alpha classes
    v1 = server.channel.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                                      request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                                      response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
    for call in (v1alpha.ServerReflectionInfo, v1):
        requests = [reflection_pb2.ServerReflectionRequest(list_services=""),
                    reflection_pb2.ServerReflectionRequest(file_containing_symbol="formwork.v1.Generation"),
                    reflection_pb2.ServerReflectionRequest(file_containing_symbol="grpc.reflection.v1.ServerReflection")]
        listed, generation_file, v1_file = list(call(iter(requests), timeout=5))
        assert {s.name for s in listed.list_services_response.service} == names
        assert generation_file.file_descriptor_response.file_descriptor_proto
        assert v1_file.file_descriptor_response.file_descriptor_proto


# ---- the queue and the KV cache ---------------------------------------------------------------


def test_full_queue_is_resource_exhausted(make_server):
    server = make_server(config=fake_config(max_num_seqs=2, max_num_waiting=2))
    calls = [server.stub.GenerateStream(long_request(), timeout=30) for _ in range(4)]
    # the fake core admits requests step by step: wait until both running slots are taken
    load = server.wait_for(lambda load: (load.num_running, load.num_waiting) == (2, 2))
    assert (load.num_running, load.num_waiting, load.num_in_flight) == (2, 2, 4)
    error = error_of(server.stub.Generate, pb.GenerateRequest(prompt="one more"), timeout=5)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.details() == "the queue is full: 4 requests in flight (2 running + 2 waiting at most); retry later"
    assert from_rpc_error(error).retry_after_s == OVERLOADED_RETRY_AFTER_S  # a google.rpc.RetryInfo: retry it
    for call in calls:
        call.cancel()
    assert idle(server.wait_for(idle))


def test_request_larger_than_the_kv_cache_is_resource_exhausted_with_the_numbers(make_server):
    server = make_server(config=fake_config(num_blocks=8))  # 128 tokens of KV
    error = error_of(server.stub.Generate, pb.GenerateRequest(prompt="hi " * 40, max_tokens=100), timeout=5)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "holds 128 tokens (8 blocks of 16)" in error.details() and "max_tokens 100" in error.details()
    assert from_rpc_error(error).retry_after_s is None  # it never fits: no retry delay


def test_prompt_longer_than_the_context_is_invalid_argument(make_server):
    server = make_server(max_model_len=64)
    error = error_of(server.stub.Generate, pb.GenerateRequest(prompt_token_ids=pb.TokenIds(ids=[5] * 64)), timeout=5)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field_violations(error) == {"prompt_token_ids": "the prompt has 64 tokens; the context length is 64 tokens "
                                                           "(prompt + output), which leaves no room to generate"}


def test_message_size_limit(make_server):
    server = make_server(limits=ServiceLimits(max_message_bytes=4096))
    error = error_of(server.stub.Generate, pb.GenerateRequest(prompt="x" * 5000), timeout=5)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "4096" in error.details()
    assert server.stub.Generate(pb.GenerateRequest(prompt="x" * 1000, max_tokens=2), timeout=5).usage.completion_tokens


# ---- cancellation and deadlines in every state ------------------------------------------------


@pytest.mark.parametrize("state", ["waiting", "waiting_for_grammar", "running"])
def test_cancel_aborts_the_request_in_the_core_in_every_state(make_server, state):
    server = make_server(config=fake_config(max_num_seqs=1))
    blocker = server.stub.GenerateStream(long_request(), timeout=30) if state == "waiting" else None
    if blocker is not None:
        next(blocker)  # it runs, so the next request waits
    fields = {"constraint": {"regex": "slow"}} if state == "waiting_for_grammar" else {}
    call = server.stub.GenerateStream(long_request(request_id="victim", **fields), timeout=30)
    load = server.wait_for(lambda load: getattr(load, f"num_{state}") == 1)
    assert getattr(load, f"num_{state}") == 1, load
    call.cancel()
    if blocker is not None:
        blocker.cancel()
    load = server.wait_for(idle)
    assert idle(load), load
    assert any(r.startswith("victim#") for r in server.core.aborted)


def test_deadline_aborts_a_request_waiting_for_its_grammar(make_server):
    server = make_server()
    error = error_of(server.stub.Generate, long_request(request_id="late", constraint={"regex": "slow"}), timeout=0.5)
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # the fake grammar takes 30 s; idle well before that means the deadline aborted the request
    assert idle(server.wait_for(idle))
    assert any(r.startswith("late#") for r in server.core.aborted)


def test_stop_string_ends_the_request_and_aborts_it_in_the_core(make_server):
    server = make_server()
    response = server.stub.Generate(long_request(request_id="s", stop=["engine"]), timeout=10)
    assert response.text == "Hello from the fake " and response.stop_string == "engine"
    assert response.finish_reason == pb.FINISH_REASON_STOP
    assert idle(server.wait_for(idle)) and any(r.startswith("s#") for r in server.core.aborted)


# ---- errors after acceptance ------------------------------------------------------------------


def test_grammar_failure_after_acceptance_ends_only_that_request(make_server):
    server = make_server()
    neighbour = server.stub.GenerateStream(long_request(max_tokens=30), timeout=30)
    next(neighbour)
    for call in (server.stub.Generate, server.stub.GenerateStream):
        error = error_of(call, long_request(constraint={"regex": "(unbalanced"}), timeout=5)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field_violations(error) == {"constraint.regex": "regex: missing closing parenthesis at position 0"}
    messages = list(neighbour)
    assert messages[-1].finish_reason == pb.FINISH_REASON_LENGTH and messages[-1].usage.completion_tokens == 30


def test_validate_constraint(make_server):
    server = make_server()
    ok = server.stub.ValidateConstraint(pb.ValidateConstraintRequest(constraint=pb.Constraint(regex="a+")), timeout=5)
    assert ok.ok and not ok.error
    bad = server.stub.ValidateConstraint(
        pb.ValidateConstraintRequest(constraint=pb.Constraint(json_schema_text="{oops")), timeout=5)
    assert not bad.ok and bad.error.startswith("constraint.json_schema_text: json_schema is not valid JSON")
    error = error_of(server.stub.ValidateConstraint, pb.ValidateConstraintRequest(), timeout=5)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "constraint" in field_violations(error)


# ---- request checks and the INTERNAL fallback -------------------------------------------------


def test_request_id_length_limit(make_server):
    server = make_server(limits=ServiceLimits(max_request_id_len=8))
    error = error_of(server.stub.Generate, pb.GenerateRequest(prompt="hi", max_tokens=2, request_id="x" * 9),
                     timeout=5)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field_violations(error) == {"request_id": "is 9 characters; the limit is 8"}
    response = server.stub.Generate(pb.GenerateRequest(prompt="hi", max_tokens=2, request_id="x" * 8), timeout=5)
    assert response.request_id == "x" * 8


def test_tokenize_and_its_errors(make_server):
    server = make_server()
    response = server.stub.Tokenize(pb.TokenizeRequest(prompt="Hello there"), timeout=5)
    assert list(response.token_ids) == server.core.tokenizer.encode("Hello there")
    assert len(response.tokens) == len(response.token_ids) and response.rendered_prompt == ""
    chat = server.stub.Tokenize(pb.TokenizeRequest(chat=pb.Chat(messages=[pb.ChatMessage(role="user", content="hi")])),
                                timeout=5)
    assert "hi" in chat.rendered_prompt and list(chat.token_ids) == server.core.tokenizer.encode(chat.rendered_prompt)
    for request, violations in (
            (pb.TokenizeRequest(), {"input": "set one of prompt or chat"}),
            (pb.TokenizeRequest(prompt=""), {"prompt": "must not be empty"}),
            (pb.TokenizeRequest(chat=pb.Chat()), {"chat.messages": "must hold at least one message"}),
            (pb.TokenizeRequest(chat=pb.Chat(messages=[pb.ChatMessage(content="no role")])),
             {"chat.messages[0].role": "must not be empty"})):
        error = error_of(server.stub.Tokenize, request, timeout=5)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, request
        assert field_violations(error) == violations


def test_an_unexpected_exception_is_internal_and_the_server_keeps_serving(make_server):
    server = make_server()

    async def broken(prompt):
        raise RuntimeError("tokenizer exploded")

    server.server.llm.encode_prompt = broken
    for call, message in ((server.stub.Tokenize, pb.TokenizeRequest(prompt="hi")),
                          (server.stub.Generate, pb.GenerateRequest(prompt="hi")),
                          (server.stub.GenerateStream, pb.GenerateRequest(prompt="hi"))):
        error = error_of(call, message, timeout=5)
        assert error.code() == grpc.StatusCode.INTERNAL
        assert error.details() == "internal error: RuntimeError: tokenizer exploded"
    del server.server.llm.encode_prompt
    assert server.stub.Generate(pb.GenerateRequest(prompt="hi", max_tokens=2), timeout=5).usage.completion_tokens == 2
    assert server.health_status() == SERVING


# ---- engine death and shutdown ----------------------------------------------------------------


def test_engine_failure_makes_calls_unavailable_and_health_not_serving(make_server):
    server = make_server(restart_policy=RestartPolicy(max_restarts=0))
    in_flight = server.stub.GenerateStream(long_request(), timeout=30)
    next(in_flight)
    error = error_of(server.stub.Generate, long_request(seed=CRASH_SEED), timeout=10)
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "fake engine crash" in error.details()
    with pytest.raises(grpc.RpcError) as info:
        list(in_flight)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    for call, message in ((server.stub.Generate, pb.GenerateRequest(prompt="x")),
                          (server.stub.GetModelInfo, pb.GetModelInfoRequest())):
        assert error_of(call, message, timeout=5).code() == grpc.StatusCode.UNAVAILABLE
    deadline = time.monotonic() + 5
    while server.health_status() != NOT_SERVING and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.health_status() == NOT_SERVING


def test_draining_reports_not_serving_for_good_while_calls_are_still_served(make_server):
    server = make_server()
    in_flight = server.stub.GenerateStream(long_request(max_tokens=20), timeout=30)
    next(in_flight)
    server.run(server.server.drain())
    assert server.health_status() == NOT_SERVING
    assert server.stub.Generate(pb.GenerateRequest(prompt="hi", max_tokens=3), timeout=5).usage.completion_tokens == 3
    server.run(server.server._set_serving(True))  # what the supervisor does once a restarted engine is warm
    assert server.health_status() == NOT_SERVING
    assert list(in_flight)[-1].finish_reason == pb.FINISH_REASON_LENGTH


def test_graceful_stop_lets_short_requests_finish_and_cancels_the_rest(make_server):
    server = make_server(step_s=0.02)
    short = server.stub.GenerateStream(long_request(max_tokens=40), timeout=30)  # about 0.8 s
    long = server.stub.GenerateStream(long_request(max_tokens=500), timeout=30)  # about 10 s
    next(short), next(long)
    stopping = asyncio.run_coroutine_threadsafe(server.server.stop(1.5), server.loop)
    deadline = time.monotonic() + 10
    while not server.server.llm.closing and time.monotonic() < deadline:  # stop() has begun
        time.sleep(0.01)
    refused = error_of(server.stub.Generate, pb.GenerateRequest(prompt="late"), timeout=5)
    while refused.code() == grpc.StatusCode.CANCELLED and time.monotonic() < deadline:
        # grpc itself cancels a call that lands in the instant its server begins to stop; the next is refused
        refused = error_of(server.stub.Generate, pb.GenerateRequest(prompt="late"), timeout=5)
    assert refused.code() == grpc.StatusCode.UNAVAILABLE
    short_messages, long_messages = list(short), list(long)
    stopping.result(10)
    assert short_messages[-1].finish_reason == pb.FINISH_REASON_LENGTH
    assert short_messages[-1].usage.completion_tokens == 40
    last = long_messages[-1]
    assert last.finish_reason == pb.FINISH_REASON_CANCELLED and 0 < last.usage.completion_tokens < 500
    assert "".join(m.text for m in long_messages)  # the text so far came back


# ---- the engine in a child process ------------------------------------------------------------


async def _generate_until_death(client: AsyncMPClient) -> EngineDeadError:
    stream = client.add_request(EngineCoreRequest("r", [1, 2, 3], SamplingParams(max_tokens=10_000, ignore_eos=True)))
    await stream.get()
    os.kill(client.pid, signal.SIGKILL)
    with pytest.raises(EngineDeadError) as info:
        while True:  # a client that missed the death would wait here for ever: wait_for fails it instead
            await asyncio.wait_for(stream.get(), timeout=30)
    return info.value


def test_process_client_fails_in_flight_requests_promptly_when_the_engine_dies():
    async def main():
        client = AsyncMPClient(fake_config(), core_factory=make_fake_core)
        info = await client.start()
        assert info.pid == client.pid != os.getpid()
        stats = await client.get_stats()
        assert stats.num_total_blocks == 64
        error = await _generate_until_death(client)
        assert "killed by signal 9" in str(error)
        assert not client.is_alive
        with pytest.raises(EngineDeadError):
            await client.get_stats()
        await client.shutdown()

    asyncio.run(main())


def test_process_client_reports_a_failed_start():
    async def main():
        client = AsyncMPClient(EngineConfig(model="/nonexistent/model"), core_factory=make_fake_core)
        with pytest.raises(EngineDeadError, match="the engine failed to start: .*nonexistent"):
            await client.start()
        await client.shutdown()

    asyncio.run(main())
