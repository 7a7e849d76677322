"""A finished batch's answers split as OpenAI's Batches API splits them: the output file holds the
lines answered 2xx, the error file every other line (an error status, or a request that never ran
because the batch was cancelled or expired), each custom_id in exactly one of them."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from service.batch.lines import LineError, RequestLine, error_line, output_key
from service.batch.store import RequestCounts


@dataclass(frozen=True)
class Unrun:
    """The error given to the requests a stopped batch never ran."""

    code: str  # "batch_cancelled" or "batch_expired"
    message: str


CANCELLED = Unrun("batch_cancelled", "the batch was cancelled before this request ran")
EXPIRED = Unrun("batch_expired", "the batch's completion window ended before this request ran")


@dataclass
class TokenUsage:
    """Tokens of a batch's answered lines, summed from each answer's `usage` (chat and text
    completions name them prompt / completion tokens, the Responses API input / output tokens)."""

    input_tokens: int = 0
    cached_tokens: int = 0  # of input_tokens: read from the prefix cache
    output_tokens: int = 0
    reasoning_tokens: int = 0  # of output_tokens

    def add(self, body: dict) -> None:
        usage = body.get("usage")
        if not isinstance(usage, dict):
            return
        self.input_tokens += _int(usage.get("prompt_tokens", usage.get("input_tokens")))
        self.output_tokens += _int(usage.get("completion_tokens", usage.get("output_tokens")))
        inputs = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
        outputs = usage.get("completion_tokens_details") or usage.get("output_tokens_details") or {}
        self.cached_tokens += _int(inputs.get("cached_tokens") if isinstance(inputs, dict) else None)
        self.reasoning_tokens += _int(outputs.get("reasoning_tokens") if isinstance(outputs, dict) else None)

    def as_openai(self) -> dict:
        """The Batch object's `usage`."""
        return {"input_tokens": self.input_tokens, "input_tokens_details": {"cached_tokens": self.cached_tokens},
                "output_tokens": self.output_tokens,
                "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
                "total_tokens": self.input_tokens + self.output_tokens}


@dataclass(frozen=True)
class SplitResults:
    counts: RequestCounts
    num_output_lines: int
    num_error_lines: int
    usage: TokenUsage


def split_results(results: Path, requests: list[RequestLine], output: Path, error: Path,
                  unrun: Unrun | None = None) -> SplitResults:
    """Write `output` and `error` from the runner's `results` file (complete lines; a torn last
    one is left out and counts as not run), copied as they are: the runner writes each custom_id
    once. `unrun`: an error line for each request not answered."""
    done: set[str] = set()
    num_completed = num_failed = num_unrun = 0
    usage = TokenUsage()
    with open(output, "wb") as answered, open(error, "wb") as failed:
        if results.exists():
            with open(results, "rb") as lines:
                for raw in lines:
                    record = _record(raw)
                    key = output_key(record) if record is not None else None
                    if not isinstance(key, str):
                        continue
                    done.add(key)
                    if is_success(record):
                        answered.write(raw)
                        num_completed += 1
                        usage.add(record["response"].get("body") or {})
                    else:
                        failed.write(raw)
                        num_failed += 1
        if unrun is not None:
            for request in requests:
                if request.custom_id not in done:
                    line = error_line(LineError(request.line_number, request.custom_id, unrun.code, unrun.message))
                    failed.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode() + b"\n")
                    num_unrun += 1
        for f in (answered, failed):
            f.flush()
            os.fsync(f.fileno())
    return SplitResults(RequestCounts(len(requests), num_completed, num_failed), num_completed,
                        num_failed + num_unrun, usage)


def is_success(record: dict) -> bool:
    """An answer line whose response has a 2xx status."""
    response = record.get("response")
    return isinstance(response, dict) and isinstance(response.get("status_code"), int) \
        and 200 <= response["status_code"] < 300


def _record(raw: bytes) -> dict | None:
    if not raw.endswith(b"\n"):
        return None  # torn by a kill
    try:
        record = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) else None


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0
