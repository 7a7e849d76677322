"""Peer: vLLM's OpenAI-compatible server (the CPU build's `vllm serve`), loaded over HTTP.

A standalone script for .peers/vllm/bin/python (see bench/peers/__init__.py for the contract):
the anchor for `bench serve --protocol http`, so Formwork's HTTP API is compared with the HTTP
server vLLM users run, not only with vLLM's engine. The server gets the AsyncLLM peer's settings
(Formwork's dtype, eager, the same thread binding and KV space) and each request goes to
`/v1/completions` with the prompt's token ids, streamed with usage, the schema in vLLM's
`structured_outputs` (compact JSON unless the request allows any whitespace). A tool-call request
goes to `/v1/chat/completions` with its messages, tools and tool_choice, streamed: the server then
runs with the payload's tool-call parser (`--enable-auto-tool-choice --tool-call-parser`), which
vLLM needs for any tool_choice but "none"; the record's calls are the ones its stream delivered.
Every schema (and set of tools) is compiled once (a one-token request) before the clock starts, as
Formwork's are.
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time

from chat_stream import ChatStream  # beside this script
from peer_loop import run_all, warm_schemas

_SERVED_NAME = "peer"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(payload: dict, max_seqs: int, port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", payload["model_dir"],
               "--served-model-name", _SERVED_NAME, "--dtype", payload.get("dtype", "float32"), "--enforce-eager",
               "--max-model-len", str(payload.get("max_model_len", 2048)), "--max-num-seqs", str(max_seqs),
               "--host", "127.0.0.1", "--port", str(port), "--seed", "0", "--disable-log-stats"]
    if payload.get("tool_call_parser"):
        command += ["--enable-auto-tool-choice", "--tool-call-parser", payload["tool_call_parser"]]
    return subprocess.Popen(command, stdout=sys.stderr, stderr=sys.stderr)


async def _wait_ready(client, base: str, server: subprocess.Popen, timeout_s: float = 900.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {server.returncode} while starting")
        try:
            if (await client.get(f"{base}/health")).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(1.0)
    raise RuntimeError(f"vllm serve was not ready after {timeout_s:.0f} s")


async def _chat(client, base: str, r: dict, max_tokens: int | None) -> dict:
    """One tool-call request as a streamed chat completion; its record with the calls delivered."""
    body = {"model": _SERVED_NAME, "messages": r["messages"], "tools": r["tools"], "tool_choice": r["tool_choice"],
            "parallel_tool_calls": r.get("parallel_tool_calls", False), "temperature": 0.0,
            "max_tokens": max_tokens or r["max_tokens"], "stream": True, "stream_options": {"include_usage": True}}
    stream = ChatStream()
    start = time.perf_counter()
    async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"vllm serve answered {response.status_code}: {await response.aread()!r}")
        async for line in response.aiter_lines():
            if not stream.feed(line, time.perf_counter() - start):
                break
    end = time.perf_counter() - start
    if stream.error:
        raise RuntimeError(f"vllm serve sent an error in the stream: {stream.error}")
    usage = (stream.final_chunk or {}).get("usage") or {}
    return {"id": r["id"], "text": stream.content, "tool_calls": stream.tool_calls,
            "finish_reason": "length" if stream.finish_reason == "length" else "stop",
            "num_prompt_tokens": usage.get("prompt_tokens", 0), "num_output_tokens": usage.get("completion_tokens", 0),
            "ttft_s": stream.token_times_s[0] if stream.token_times_s else end, "e2e_s": end,
            "token_times_s": stream.token_times_s}


def _prompt_mismatches(payload: dict, runs_out: list[dict]) -> int:
    """Tool-call records whose prompt, as vLLM rendered the messages, is not as long as the given token ids."""
    lengths = {r["id"]: len(r["prompt_token_ids"]) for run in payload["runs"] for r in run["requests"] if r.get("tools")}
    return sum(1 for run in runs_out for rec in run["records"]
               if rec["id"] in lengths and rec["num_prompt_tokens"] != lengths[rec["id"]])


async def _run(payload: dict) -> dict:
    import httpx
    import vllm

    max_seqs = max(run["concurrency"] for run in payload["runs"])
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    server = _start_server(payload, max_seqs, port)
    try:
        async with httpx.AsyncClient(timeout=600.0, limits=httpx.Limits(max_connections=None)) as client:
            await _wait_ready(client, base, server)
            load_s = time.perf_counter() - started

            async def one(r: dict, max_tokens: int | None = None) -> dict:
                if r.get("tools"):
                    return await _chat(client, base, r, max_tokens)
                body = {"model": _SERVED_NAME, "prompt": r["prompt_token_ids"], "temperature": 0.0,
                        "max_tokens": max_tokens or r["max_tokens"], "stream": True,
                        "stream_options": {"include_usage": True}}
                if r["schema"] is not None:
                    body["structured_outputs"] = {"json": r["schema"],
                                                  "disable_any_whitespace": not r.get("any_whitespace", False)}
                parts, times, finish, num_tokens = [], [], "length", 0
                start = time.perf_counter()
                async with client.stream("POST", f"{base}/v1/completions", json=body) as response:
                    if response.status_code != 200:
                        raise RuntimeError(f"vllm serve answered {response.status_code}: {await response.aread()!r}")
                    async for line in response.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        for choice in chunk.get("choices", []):
                            if choice.get("text"):
                                times.append(time.perf_counter() - start)  # chunks carry text, as Formwork's HTTP
                                parts.append(choice["text"])
                            finish = choice.get("finish_reason") or finish
                        if chunk.get("usage"):
                            num_tokens = chunk["usage"]["completion_tokens"]
                end = time.perf_counter() - start
                return {"id": r["id"], "text": "".join(parts), "finish_reason": "length" if finish == "length" else "stop",
                        "num_prompt_tokens": len(r["prompt_token_ids"]), "num_output_tokens": num_tokens,
                        "ttft_s": times[0] if times else end, "e2e_s": end, "token_times_s": times}

            warm_s = await warm_schemas(payload, one)
            runs_out = await run_all(payload, one)
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
    notes = [f"warm-up (one token per distinct schema and prompt) {warm_s:.1f} s, not counted"]
    if payload.get("tool_call_parser"):
        notes.append(f"tool calls: streamed /v1/chat/completions, --tool-call-parser {payload['tool_call_parser']}; "
                     f"{_prompt_mismatches(payload, runs_out)} prompts rendered to another length than Formwork's")
    else:
        notes.append("streamed /v1/completions with token-id prompts")
    return {"peer": "vllm-http", "version": f"vllm {vllm.__version__} (CPU build) OpenAI server, "
            f"{payload.get('dtype', 'float32')}, eager, {os.environ.get('VLLM_CPU_OMP_THREADS_BIND')} thread binding",
            "load_s": load_s, "notes": notes, "runs": runs_out}


def main() -> int:
    payload = json.load(sys.stdin)
    try:
        import httpx  # noqa: F401
        import vllm  # noqa: F401
    except ImportError as e:
        print(json.dumps({"skipped": f"vllm (or httpx) is not importable here: {e}"}))
        return 0
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # as the AsyncLLM peer (docs/benchmarks.md)
    result = asyncio.run(_run(payload))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
