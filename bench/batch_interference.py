"""What a running batch costs interactive requests: `formwork bench batch-interference`.

One server (started here, with the Batches API on a fresh data directory). The same interactive
chat requests, one at a time, are timed alone and while a batch job runs on the same server (its
lines at the batch priority, `--batch-concurrency` at a time), alternated, and alone once more at
the end (a shared machine drifts). The figure is the ratio of p99 latency beside a batch to p99
alone (goal: at most 1.5). Each beside phase starts a fresh batch, sized not to finish first
(it is cancelled after); a request that ends after its batch did is left out.
"""
from __future__ import annotations

import argparse
import json
import secrets
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.server_process import ServerProcess

QUESTIONS = ("What is the capital of France?", "Name three colors.", "What is 12 times 7?", "Say hello in Spanish.",
             "Who wrote Hamlet?", "What is the boiling point of water?", "Name a planet.", "Spell 'cat' backwards.")


def add_parser(which) -> None:
    parser = which.add_parser("batch-interference",
                              help="interactive latency while a batch job runs on the same server, against alone")
    parser.add_argument("--requests", type=int, default=40, help="interactive requests per phase (default: 40)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="alone / beside-a-batch phase pairs, then alone once more (default: 2)")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per interactive answer (default: 16)")
    parser.add_argument("--batch-lines", type=int, default=400, help="lines of the batch job (default: 400)")
    parser.add_argument("--batch-max-tokens", type=int, default=64, help="tokens per batch answer (default: 64)")
    parser.add_argument("--batch-concurrency", type=int, default=4,
                        help="the server's --batch-concurrency: batch lines in the engine at once (default: 4)")
    parser.add_argument("--server-args", default="", help="more `formwork serve` options, space-separated")
    parser.add_argument("--output", default="build/bench/batch_interference.json")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="formwork-bench-data-") as data_dir:
        server_args = ["--data-dir", data_dir, "--batch-concurrency", str(args.batch_concurrency),
                       *args.server_args.split()]
        with ServerProcess(server_args, startup_timeout_s=900, http=True) as server:
            assert server.http_url is not None
            result = interference(server.http_url, args)
    print(format_result(result))
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def interference(url: str, args: argparse.Namespace) -> dict:
    """Phases alone and beside a batch, alternated `args.rounds` times, and alone once more at the
    end: the machine's drift (other processes on a shared machine) falls on both sides."""
    bodies = [{"messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
               "max_tokens": args.max_tokens, "temperature": 0} for i in range(args.requests)]
    for body in bodies[:3]:  # warm: chat template, prefix cache
        _post_json(f"{url}/v1/chat/completions", body)
    phases: list[dict] = []
    for _ in range(args.rounds):
        phases.append({"name": "alone", "latencies_s": _latencies(url, bodies)})
        phases.append({"name": "beside batch", **_beside_batch(url, bodies, args)})
    phases.append({"name": "alone", "latencies_s": _latencies(url, bodies)})
    alone = [t for phase in phases if phase["name"] == "alone" for t in phase["latencies_s"]]
    beside = [t for phase in phases if phase["name"] == "beside batch" for t in phase["latencies_s"]]
    return {
        "requests": args.requests, "max_tokens": args.max_tokens, "rounds": args.rounds,
        "batch_lines": args.batch_lines, "batch_max_tokens": args.batch_max_tokens,
        "batch_concurrency": args.batch_concurrency,
        "phases": [{**phase, **_summary(phase["latencies_s"])} for phase in phases],
        "alone": _summary(alone), "beside_batch": _summary(beside),
        "p50_ratio": _ratio(beside, alone, 50), "p99_ratio": _ratio(beside, alone, 99),
    }


def _beside_batch(url: str, bodies: list[dict], args: argparse.Namespace) -> dict:
    """The requests' latencies while a fresh batch job is in progress (it is cancelled after);
    a request that ended after the batch did is left out."""
    batch_id = _start_batch(url, args.batch_lines, args.batch_max_tokens)
    _wait_for(lambda: _get_json(f"{url}/v1/batches/{batch_id}")["request_counts"]["completed"] >= 1, 600)
    latencies = []
    for body in bodies:
        latency = _latency(url, body)
        if _get_json(f"{url}/v1/batches/{batch_id}")["status"] == "in_progress":
            latencies.append(latency)
    _post_json(f"{url}/v1/batches/{batch_id}/cancel", {})
    _wait_for(lambda: _get_json(f"{url}/v1/batches/{batch_id}")["status"] == "cancelled", 600)
    batch = _get_json(f"{url}/v1/batches/{batch_id}")
    return {"latencies_s": latencies, "batch_answered": batch["request_counts"]["completed"]}


def format_result(result: dict) -> str:
    lines = [f"interactive: {result['requests']} chat requests of {result['max_tokens']} tokens, one at a time; "
             f"batch: {result['batch_lines']} lines of {result['batch_max_tokens']} tokens, "
             f"{result['batch_concurrency']} at a time; {result['rounds']} rounds"]
    for phase in result["phases"]:
        answered = f", the batch answered {phase['batch_answered']} lines" if "batch_answered" in phase else ""
        lines.append(f"  {phase['name']:13s} p50 {phase['p50_s'] * 1000:7.1f} ms   p99 {phase['p99_s'] * 1000:7.1f} ms"
                     f"   (n={phase['n']}{answered})")
    for name in ("alone", "beside_batch"):
        s = result[name]
        lines.append(f"  {name + ', all':13s} p50 {s['p50_s'] * 1000:7.1f} ms   p99 {s['p99_s'] * 1000:7.1f} ms"
                     f"   (n={s['n']})")
    lines.append(f"  beside batch / alone: p50 x{result['p50_ratio']:.2f}, p99 x{result['p99_ratio']:.2f} "
                 f"(goal: p99 within x1.5)")
    return "\n".join(lines)


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile, interpolated between the closest ranks."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _summary(latencies: list[float]) -> dict:
    if not latencies:
        return {"n": 0, "p50_s": float("nan"), "p99_s": float("nan"), "mean_s": float("nan")}
    return {"n": len(latencies), "p50_s": percentile(latencies, 50), "p99_s": percentile(latencies, 99),
            "mean_s": statistics.fmean(latencies)}


def _ratio(beside: list[float], alone: list[float], p: float) -> float:
    if not beside or not alone:
        return float("nan")
    return percentile(beside, p) / percentile(alone, p)


def _latencies(url: str, bodies: list[dict]) -> list[float]:
    return [_latency(url, body) for body in bodies]


def _latency(url: str, body: dict) -> float:
    start = time.perf_counter()
    _post_json(f"{url}/v1/chat/completions", body)
    return time.perf_counter() - start


def _start_batch(url: str, num_lines: int, max_tokens: int) -> str:
    lines = [json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "messages": [{"role": "user", "content": f"Write a short story about the number {i}."}],
        "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}}) for i in range(num_lines)]
    uploaded = _upload(url, ("\n".join(lines) + "\n").encode())
    batch = _post_json(f"{url}/v1/batches", {"input_file_id": uploaded["id"], "endpoint": "/v1/chat/completions",
                                             "completion_window": "24h"})
    if batch["status"] != "in_progress":
        raise RuntimeError(f"the batch did not start: {batch}")
    return batch["id"]


def _upload(url: str, content: bytes) -> dict:
    boundary = secrets.token_hex(16)
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"batch.jsonl\"\r\n"
            f"Content-Type: application/jsonl\r\n\r\n").encode() + content + f"\r\n--{boundary}--\r\n".encode()
    return _request(f"{url}/v1/files", body, f"multipart/form-data; boundary={boundary}")


def _post_json(url: str, body: dict) -> dict:
    return _request(url, json.dumps(body).encode(), "application/json")


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=600) as response:
        return json.loads(response.read())


def _request(url: str, data: bytes, content_type: str) -> dict:
    request = urllib.request.Request(url, data=data, headers={"Content-Type": content_type}, method="POST")
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def _wait_for(predicate, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not reached in {timeout_s} s")
        time.sleep(0.1)
