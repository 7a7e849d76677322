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


@dataclass(frozen=True)
class SplitResults:
    counts: RequestCounts
    num_output_lines: int
    num_error_lines: int


def split_results(results: Path, requests: list[RequestLine], output: Path, error: Path,
                  unrun: Unrun | None = None) -> SplitResults:
    """Write `output` and `error` from the runner's `results` file (complete lines; a torn last
    one is left out and counts as not run), copied as they are: the runner writes each custom_id
    once. `unrun`: an error line for each request not answered."""
    done: set[str] = set()
    num_completed = num_failed = num_unrun = 0
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
                        answered.write(raw if raw.endswith(b"\n") else raw + b"\n")
                        num_completed += 1
                    else:
                        failed.write(raw if raw.endswith(b"\n") else raw + b"\n")
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
                        num_failed + num_unrun)


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
