"""Peer: vLLM's OpenAI-compatible server (the CPU build's `vllm serve`), loaded over HTTP.

A standalone script for .peers/vllm/bin/python (see bench/peers/__init__.py for the contract):
the anchor for `bench serve --protocol http`, so Formwork's HTTP API is compared with the HTTP
server vLLM users run, not only with vLLM's engine. The server gets the AsyncLLM peer's settings
(Formwork's dtype, eager, the same thread binding and KV space) and each request goes to
`/v1/completions` with the prompt's token ids, streamed with usage, the schema in vLLM's
`structured_outputs` (compact JSON unless the request allows any whitespace). Every schema is
compiled once (a one-token request) before the clock starts, as Formwork's are.
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time

from peer_loop import run_all, warm_schemas  # beside this script

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
    return {"peer": "vllm-http", "version": f"vllm {vllm.__version__} (CPU build) OpenAI server, "
            f"{payload.get('dtype', 'float32')}, eager, {os.environ.get('VLLM_CPU_OMP_THREADS_BIND')} thread binding",
            "load_s": load_s, "notes": [f"warm-up (one token per distinct schema) {warm_s:.1f} s, not counted",
                                        "streamed /v1/completions with token-id prompts"],
            "runs": runs_out}


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
