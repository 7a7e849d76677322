"""A batch's input file checked before it runs, as OpenAI's Batches API checks it: every line a
request to the batch's endpoint, each custom_id once. A file that fails is not run at all: the
batch fails with the problems (OpenAI's `errors`: code, message, param, line)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.batch.lines import LineError, RequestLine, read_lines

MAX_REPORTED_ERRORS = 100  # a file with more problems reports its first ones


@dataclass(frozen=True)
class CheckedInput:
    requests: list[RequestLine]  # every line, in file order, when `errors` is empty
    errors: list[dict[str, Any]]  # OpenAI batch errors: {code, message, param, line}


def read_input(path: Path) -> list[RequestLine | LineError]:
    """The input file's lines parsed (blank lines skipped)."""
    return read_lines(path.read_bytes().split(b"\n"))


def check_input(path: Path, endpoint: str, max_requests: int) -> CheckedInput:
    """The requests of a batch input file, or the reasons it cannot run."""
    lines = read_input(path)
    errors: list[dict[str, Any]] = []
    requests: list[RequestLine] = []
    for line in lines:
        if isinstance(line, LineError):
            errors.append(_error(line.code, line.message, line.line_number))
        elif line.url != endpoint:
            errors.append(_error("mismatched_endpoint", f"line {line.line_number} asks for {line.url}; every line "
                                 f"of this batch must ask for its endpoint, {endpoint}", line.line_number, "url"))
        else:
            requests.append(line)
    if not lines:
        errors.append(_error("empty_file", "the input file has no request lines"))
    elif len(lines) > max_requests:
        errors.append(_error("too_many_requests", f"the input file has {len(lines)} requests; this server runs at "
                             f"most {max_requests} in one batch"))
    return CheckedInput(requests if not errors else [], errors[:MAX_REPORTED_ERRORS])


def _error(code: str, message: str, line: int | None = None, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}
