"""OpenAI's batch file format: request lines in, output lines out.

A request line:  {"custom_id": "doc-1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}
An answer line:  {"id": "batch_req_...", "custom_id": "doc-1",
                  "response": {"status_code": 200, "request_id": "req_...", "body": {...}}, "error": null}
An error line:   {"id": "batch_req_...", "custom_id": "doc-1", "response": null,
                  "error": {"code": "invalid_url", "message": "..."}}

A body the API refuses is an answer line with the API's status and error body (as OpenAI's batch
writes it); a line that cannot be sent at all (not JSON, no custom_id, an unknown url, a streamed
body) is an error line. A line without a usable custom_id (none, or one an earlier line already
uses) gets `"custom_id": null` and `"line": N` (its 1-based line number in the input), so that
every custom_id appears at most once in the output and a resumed job can still tell it is done.
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

# the urls a batch line may name (the API's generation routes)
BATCH_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")

LineKey = str | int  # a line's custom_id, or its line number when it has no usable custom_id


@dataclass(frozen=True)
class RequestLine:
    """A line that can be sent: POST `body` to `url`."""

    line_number: int  # 1-based, in the input file
    custom_id: str
    url: str
    body: dict[str, Any]

    @property
    def key(self) -> LineKey:
        return self.custom_id


@dataclass(frozen=True)
class LineError:
    """A line that cannot be sent; `code` is a short name for the problem, `message` says what to fix."""

    line_number: int
    custom_id: str | None  # None: the line has no custom_id of its own (none, or a duplicate)
    code: str
    message: str

    @property
    def key(self) -> LineKey:
        return self.custom_id if self.custom_id is not None else self.line_number


def parse_line(text: str | bytes, line_number: int) -> RequestLine | LineError:
    """One input line (without its newline) read as an OpenAI batch request line."""
    try:
        line = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        return LineError(line_number, None, "invalid_json_line", f"line {line_number} is not valid JSON: {e}")
    if not isinstance(line, dict):
        return LineError(line_number, None, "invalid_request_line",
                         f"line {line_number} is {type(line).__name__}, not a JSON object")
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return LineError(line_number, None, "missing_custom_id",
                         f"line {line_number} has no custom_id (a non-empty string naming the request)")
    unknown = sorted(set(line) - {"custom_id", "method", "url", "body"})
    if unknown:
        return LineError(line_number, custom_id, "invalid_request_line",
                         f"unknown field {unknown[0]!r}: a request line has custom_id, method, url and body")
    method = line.get("method")
    if method != "POST":
        return LineError(line_number, custom_id, "invalid_method", f"method must be \"POST\", got {method!r}")
    url = line.get("url")
    if url not in BATCH_URLS:
        return LineError(line_number, custom_id, "invalid_url",
                         f"url must be one of {', '.join(BATCH_URLS)}, got {url!r}")
    body = line.get("body")
    if not isinstance(body, dict):
        return LineError(line_number, custom_id, "invalid_request_line", "body must be a JSON object (the request "
                                                                         f"to POST to {url})")
    if body.get("stream"):
        return LineError(line_number, custom_id, "stream_not_supported",
                         "body.stream must be false or absent: a batch answers each request whole")
    return RequestLine(line_number, custom_id, url, body)


def read_lines(raw_lines: list[bytes]) -> list[RequestLine | LineError]:
    """Every line of an input file parsed (blank lines skipped; they keep their number), with
    each custom_id kept by its first line (`with_unique_ids`)."""
    return with_unique_ids([parse_line(raw, index + 1) for index, raw in enumerate(raw_lines) if raw.strip()])


def with_unique_ids(lines: list[RequestLine | LineError]) -> list[RequestLine | LineError]:
    """The lines, a custom_id used by an earlier line turned into a `duplicate_custom_id` error
    (without a custom_id of its own, so that no key is written twice)."""
    owners: dict[str, int] = {}  # custom_id -> the line that uses it first
    unique: list[RequestLine | LineError] = []
    for line in lines:
        if line.custom_id is not None:
            owner = owners.setdefault(line.custom_id, line.line_number)
            if owner != line.line_number:
                line = LineError(line.line_number, None, "duplicate_custom_id",
                                 f"custom_id {line.custom_id!r} is already used by line {owner}; each request "
                                 f"needs its own")
        unique.append(line)
    return unique


def answer_line(custom_id: str, status_code: int, body: dict[str, Any]) -> dict[str, Any]:
    """The output line of a request the API answered (whatever its status)."""
    return {"id": _line_id(), "custom_id": custom_id,
            "response": {"status_code": status_code, "request_id": f"req_{secrets.token_hex(16)}", "body": body},
            "error": None}


def error_line(error: LineError) -> dict[str, Any]:
    """The output line of a line that could not be sent."""
    line: dict[str, Any] = {"id": _line_id(), "custom_id": error.custom_id, "response": None,
                            "error": {"code": error.code, "message": error.message}}
    if error.custom_id is None:
        line["line"] = error.line_number
    return line


def output_key(line: dict[str, Any]) -> LineKey | None:
    """The key of an output line (what a resumed job skips), None when the line has neither a
    custom_id nor a line number."""
    custom_id = line.get("custom_id")
    if isinstance(custom_id, str):
        return custom_id
    line_number = line.get("line")
    return line_number if isinstance(line_number, int) else None


def _line_id() -> str:
    return f"batch_req_{secrets.token_hex(16)}"
