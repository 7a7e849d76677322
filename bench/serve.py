"""The load generator of `formwork bench serve`: requests over gRPC to a running server, on loopback.

Two arrival patterns, both bounded by a request count and a time limit:

* fixed concurrency: N workers, each sends its next request as soon as its last one finished;
* Poisson arrivals at `rate` requests/s (open loop: a request is sent when its time comes,
  whatever is still in flight).

Every request is a server-streaming `GenerateStream` with a deadline; the client records when each
message carrying tokens arrived, so TTFT and inter-token latency are seen as a client sees them,
and keeps the server's own timings (queue, grammar wait, forward passes) from the last message.
The only bench module that imports grpc.
"""
from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass

import grpc

from bench import report
from bench.request_record import RequestRecord
from service._gen.formwork.v1 import generation_pb2 as pb
from service._gen.formwork.v1 import generation_pb2_grpc as pb_grpc

_LOOPBACK = ("127.", "localhost", "[::1]")


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload: a chat, an optional JSON Schema, and how to check the answer."""

    request_id: str
    messages: list[dict]
    max_tokens: int
    schema: dict | None = None  # None: unconstrained
    jump_forward: bool | None = None  # None: the server's default
    speculative: bool | None = None  # speculative decoding from the prompt; None: the server's default
    expected: dict | None = None  # json-extraction: the right answer, for field accuracy
    check_schema: dict | None = None  # the schema an unconstrained answer is checked against
    ignore_eos: bool = False  # generate exactly max_tokens (length-matched comparisons)
    # tool-calls: the tools offered ({"name", "description", "parameters"}) and the choice
    # ("required": only calls, constrained; "none": the tools shown, the output free)
    tools: list[dict] | None = None
    tool_choice: str = "required"
    expected_tool: str | None = None  # the tool the request asks for
    grammar_backend: str | None = None  # "auto", "xgrammar" or "llguidance"; None: the server's default


def check_loopback(address: str) -> None:
    """The bench only ever loads servers on this machine."""
    if not address.startswith(_LOOPBACK):
        raise ValueError(f"bench serve only targets loopback addresses (127.0.0.0/8, localhost, [::1]); got {address}")


def generate_request(spec: RequestSpec) -> pb.GenerateRequest:
    request = pb.GenerateRequest(
        request_id=spec.request_id, max_tokens=spec.max_tokens, temperature=0.0,
        chat=pb.Chat(messages=[pb.ChatMessage(role=m["role"], content=m["content"]) for m in spec.messages]))
    if spec.ignore_eos:
        request.ignore_eos = True
    if spec.speculative is not None:
        request.speculative = spec.speculative
    for tool in spec.tools or []:
        request.tools.append(_tool(tool))
    if spec.tools:
        request.tool_choice.mode = pb.ToolChoiceMode.Value(f"TOOL_CHOICE_MODE_{spec.tool_choice.upper()}")
        request.parallel_tool_calls = False
    if spec.schema is not None:
        constraint = pb.Constraint(json_schema_text=json.dumps(spec.schema))
        if spec.jump_forward is not None:
            constraint.jump_forward = spec.jump_forward
        if spec.grammar_backend is not None:
            constraint.grammar_backend = pb.GrammarBackend.Value(f"GRAMMAR_BACKEND_{spec.grammar_backend.upper()}")
        request.constraint.CopyFrom(constraint)
    return request


def take_parsed_calls(record: RequestRecord, final: pb.GenerateResponse) -> None:
    """The calls as the server parsed them in its own syntax (whichever it serves), the rest as text."""
    record.tool_calls = [(call.name, call.arguments_json) for call in final.tool_calls]
    record.text = final.content


def _tool(tool: dict) -> pb.Tool:
    return pb.Tool(name=tool["name"], description=tool.get("description", ""),
                   parameters_json=json.dumps(tool["parameters"]))


class Client:
    """An async Generation client on one channel. Every call has a deadline."""

    def __init__(self, address: str, rpc_timeout_s: float = 300.0) -> None:
        check_loopback(address)
        self.address = address
        self.rpc_timeout_s = rpc_timeout_s
        self._channel = grpc.aio.insecure_channel(address, options=[("grpc.max_receive_message_length", 64 << 20)])
        self._stub = pb_grpc.GenerationStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def model_info(self) -> pb.ModelInfo:
        return await self._stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30)

    async def prompt_token_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The token ids the server's chat template and tokenizer give (what the peers are fed),
        with `tools` ({"name", "description", "parameters"}) rendered as Generate renders them."""
        request = pb.TokenizeRequest(chat=pb.Chat(messages=[pb.ChatMessage(**m) for m in messages]),
                                     tools=[_tool(t) for t in tools or []])
        return list((await self._stub.Tokenize(request, timeout=30)).token_ids)

    async def validate(self, schema: dict) -> pb.ValidateConstraintResponse:
        """Compile a schema (warms the server's grammar cache)."""
        request = pb.ValidateConstraintRequest(constraint=pb.Constraint(json_schema_text=json.dumps(schema)))
        return await self._stub.ValidateConstraint(request, timeout=self.rpc_timeout_s)

    async def run(self, spec: RequestSpec) -> RequestRecord:
        """One GenerateStream; never raises for an RPC error (the record says what failed)."""
        record = RequestRecord(spec.request_id, sent_at=time.monotonic())
        last = None
        try:
            call = self._stub.GenerateStream(generate_request(spec), timeout=self.rpc_timeout_s)
            parts = []
            async for message in call:
                now = time.monotonic() - record.sent_at
                if message.token_ids:
                    record.token_times_s.append(now)
                    record.token_counts.append(len(message.token_ids))
                parts.append(message.text)
                last = message
            record.text = "".join(parts)
            record.e2e_s = time.monotonic() - record.sent_at
        except grpc.aio.AioRpcError as e:
            record.error = f"{e.code().name}: {e.details()}"
            record.e2e_s = time.monotonic() - record.sent_at
            return record
        if last is None or last.finish_reason == pb.FINISH_REASON_UNSPECIFIED:
            record.error = "the stream ended without a final message"
            return record
        record.ok = True
        record.finish_reason = pb.FinishReason.Name(last.finish_reason).removeprefix("FINISH_REASON_").lower()
        if spec.tools and spec.tool_choice != "none":
            take_parsed_calls(record, last)
        record.ttft_s = record.token_times_s[0] if record.token_times_s else record.e2e_s
        usage, timings = last.usage, last.timings
        record.num_prompt_tokens = usage.prompt_tokens
        record.num_output_tokens = usage.completion_tokens
        record.num_forced_tokens = usage.forced_tokens
        record.num_cached_prompt_tokens = usage.cached_prompt_tokens
        record.num_draft_tokens = usage.draft_tokens
        record.num_accepted_draft_tokens = usage.accepted_draft_tokens
        record.server_queued_s = timings.queued_s
        record.server_grammar_wait_s = timings.grammar_wait_s
        record.server_ttft_s = timings.time_to_first_token_s
        record.server_total_s = timings.total_s
        record.forward_passes = timings.forward_passes
        if last.grammar_backend:
            name = pb.GrammarBackend.Name(last.grammar_backend)
            record.grammar_backend = name.removeprefix("GRAMMAR_BACKEND_").lower()
        return record


@dataclass(frozen=True)
class LoadShape:
    """How requests arrive: `concurrency` workers (closed loop) or Poisson at `rate` per second."""

    concurrency: int | None = None
    rate: float | None = None
    max_requests: int = 64
    max_duration_s: float = 600.0
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of concurrency and rate")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be positive, got {self.rate}")
        if self.max_requests < 1 or not self.max_duration_s > 0:
            raise ValueError("max_requests and max_duration_s must be positive")

    @property
    def label(self) -> str:
        return f"concurrency {self.concurrency}" if self.concurrency is not None else f"rate {self.rate:g}/s"


@dataclass
class LoadResult:
    records: list[RequestRecord]
    wall_s: float  # first send to last answer
    stopped_by_time: bool  # the time limit, not the request count, ended the run


async def run_load(client: Client, specs: list[RequestSpec], shape: LoadShape) -> LoadResult:
    """Send up to shape.max_requests of `specs` (cycled) in the given shape; stop sending new
    requests once max_duration_s has passed, and wait (each RPC has its deadline) for those sent."""
    if not specs:
        raise ValueError("no requests to send")
    todo = [specs[i % len(specs)] for i in range(shape.max_requests)]
    todo = [RequestSpec(**{**s.__dict__, "request_id": f"{s.request_id}#{i}"}) for i, s in enumerate(todo)]
    start = time.monotonic()
    deadline = start + shape.max_duration_s
    records: list[RequestRecord] = []
    stopped_by_time = False

    if shape.concurrency is not None:
        queue = iter(todo)

        async def worker() -> None:
            nonlocal stopped_by_time
            for spec in queue:  # one shared iterator: each spec goes to exactly one worker
                if time.monotonic() > deadline:
                    stopped_by_time = True
                    return
                records.append(await client.run(spec))

        await asyncio.gather(*(worker() for _ in range(shape.concurrency)))
    else:
        rng = random.Random(shape.seed)
        tasks = []
        next_at = start
        for spec in todo:
            next_at += rng.expovariate(shape.rate)
            if next_at > deadline:
                stopped_by_time = True
                break
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            tasks.append(asyncio.create_task(client.run(spec)))
        records = list(await asyncio.gather(*tasks))
    end = max((r.sent_at + r.e2e_s for r in records), default=start)
    return LoadResult(records, end - start, stopped_by_time)


async def compile_all(client: Client, specs: list[RequestSpec]) -> tuple[list[RequestSpec], dict]:
    """ValidateConstraint every distinct schema once: the specs whose schema compiles, and the
    compile times (cold compiles only)."""
    compile_s, keep, rejected, seen = [], [], 0, {}
    for spec in specs:
        if spec.schema is None:
            keep.append(spec)
            continue
        key = json.dumps(spec.schema, sort_keys=True)
        if key not in seen:
            response = await client.validate(spec.schema)
            seen[key] = response.ok
            if response.ok and not response.cached:
                compile_s.append(response.compile_s)
        if seen[key]:
            keep.append(spec)
        else:
            rejected += 1
    stats = {f"compile_s_p{p}": report.percentile(compile_s, p) for p in report.PERCENTILES}
    return keep, {**stats, "num_compiled": len(compile_s), "num_rejected": rejected,
                  "compile_s_max": max(compile_s, default=None)}


def log(message: str) -> None:
    print(f"[bench serve] {message}", file=sys.stderr, flush=True)
