"""The load generator's client for the OpenAI-compatible HTTP API (`bench serve --protocol http`).

The same requests as bench/serve.py's gRPC Client, as streamed `/v1/chat/completions` calls
(server-sent events, `stream_options.include_usage`), recorded the same way: when each chunk
carrying text or a piece of a tool call arrived, the calls as the server parsed them, and the
server's usage and timings from the last chunk. Model info,
tokenizing and compiling still go over gRPC (`grpc_client`). The only bench module that imports httpx.
"""
from __future__ import annotations

import json
import time

import httpx

from bench.peers.chat_stream import ChatStream
from bench.request_record import RequestRecord
from bench.serve import Client, RequestSpec, check_loopback


def openai_tools(tools: list[dict]) -> list[dict]:
    """Tools as {"name", "description", "parameters"} in OpenAI's shape."""
    return [{"type": "function", "function": tool} for tool in tools]


def chat_body(spec: RequestSpec) -> dict:
    body: dict = {"messages": spec.messages, "max_tokens": spec.max_tokens, "temperature": 0.0, "stream": True,
                  "stream_options": {"include_usage": True}}
    if spec.ignore_eos:
        body["ignore_eos"] = True
    if spec.tools:  # as the gRPC request sends them: one call at most
        body.update(tools=openai_tools(spec.tools), tool_choice=spec.tool_choice, parallel_tool_calls=False)
    if spec.schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": spec.schema}}
        if spec.jump_forward is not None:
            body["formwork"] = {"jump_forward": spec.jump_forward}
    return body


class HttpClient:
    """Streams chat completions from `base_url` (http://HOST:PORT); the rest through `grpc_client`."""

    def __init__(self, base_url: str, grpc_client: Client, rpc_timeout_s: float = 300.0) -> None:
        check_loopback(base_url.removeprefix("http://"))
        self.grpc = grpc_client
        self._url = f"{base_url}/v1/chat/completions"
        self._http = httpx.AsyncClient(timeout=rpc_timeout_s, limits=httpx.Limits(
            max_connections=None, max_keepalive_connections=512))

    async def close(self) -> None:
        await self._http.aclose()

    async def model_info(self):
        return await self.grpc.model_info()

    async def prompt_token_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        return await self.grpc.prompt_token_ids(messages, tools)

    async def validate(self, schema: dict):
        return await self.grpc.validate(schema)

    async def run(self, spec: RequestSpec) -> RequestRecord:
        """One streamed chat completion; never raises for an HTTP error (the record says what failed)."""
        record = RequestRecord(spec.request_id, sent_at=time.monotonic())
        stream = ChatStream()
        try:
            async with self._http.stream("POST", self._url, json=chat_body(spec)) as response:
                if response.status_code != 200:
                    body = json.loads(await response.aread())
                    record.error = f"HTTP {response.status_code}: {body['error']['message']}"
                    record.e2e_s = time.monotonic() - record.sent_at
                    return record
                async for line in response.aiter_lines():
                    if not stream.feed(line, time.monotonic() - record.sent_at):
                        break
            record.e2e_s = time.monotonic() - record.sent_at
        except httpx.HTTPError as e:
            record.error = f"{type(e).__name__}: {e}"
            record.e2e_s = time.monotonic() - record.sent_at
            return record
        final, finish_reason = stream.final_chunk, stream.finish_reason
        if stream.error or final is None or finish_reason is None:
            record.error = stream.error or "the stream ended without a final chunk"
            return record
        record.ok = True
        record.text = stream.content
        record.tool_calls = stream.tool_calls if spec.tools else None
        record.token_times_s = stream.token_times_s
        record.token_counts = [1] * len(stream.token_times_s)  # chunks carry text, not token counts
        record.finish_reason = "stop" if finish_reason == "tool_calls" else finish_reason
        record.ttft_s = record.token_times_s[0] if record.token_times_s else record.e2e_s
        usage = final["usage"]
        record.num_prompt_tokens = usage["prompt_tokens"]
        record.num_output_tokens = usage["completion_tokens"]
        record.num_cached_prompt_tokens = usage["prompt_tokens_details"]["cached_tokens"]
        choice = final["formwork"]["choices"][0]
        record.num_forced_tokens = choice["forced_tokens"]
        record.forward_passes = choice["forward_passes"]
        timings = choice.get("timings", {})
        record.server_queued_s = timings.get("queued_s", 0.0)
        record.server_grammar_wait_s = timings.get("grammar_wait_s", 0.0)
        record.server_ttft_s = timings.get("time_to_first_token_s", 0.0)
        record.server_total_s = timings.get("total_s", 0.0)
        return record
