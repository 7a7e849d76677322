"""A job's output file: JSON lines appended whole, and read back to resume.

Each record is one `os.write` of its whole line (newline included) on a file opened with
O_APPEND, so a process killed at any moment (SIGKILL included) leaves every earlier line intact
and at most the last one torn: the page cache holds what was written even when the process dies.
`fsync` only guards against the machine going down, so it runs at most once a `sync_interval_s`
and at close, not once a line.

Opened again, the file is read first: a torn last line (the start of a record without its
newline, left by a kill, or the zeros a power loss can leave) is cut off, and the keys of the
complete lines say what is done. Anything else that is not a record refuses the file, untouched.
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from service.batch.lines import LineKey

logger = logging.getLogger(__name__)

KeyOf = Callable[[dict[str, Any]], LineKey | None]


class OutputFileError(Exception):
    """The output file cannot be resumed (it is not a job's output) or written."""


class OutputFile:
    """Not thread-safe: one writer (the job runner's event loop)."""

    def __init__(self, path: str | Path, key_of: KeyOf, sync_interval_s: float = 1.0) -> None:
        """Open `path` for appending (created if missing), reading back what it holds: `done`
        is the keys of its complete lines, `num_torn_bytes` what was cut off its end."""
        self.path = Path(path)
        self.sync_interval_s = sync_interval_s
        self.done: set[LineKey] = set()
        self.num_torn_bytes = 0
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as e:
            raise OutputFileError(f"cannot open the output file {self.path}: {e.strerror}") from None
        try:
            self._resume(key_of)
        except BaseException:
            os.close(self._fd)
            raise
        self._last_sync = time.monotonic()
        self._unsynced = False

    def _resume(self, key_of: KeyOf) -> None:
        with open(self._fd, "rb", closefd=False) as existing:
            data = existing.read()
        lines = data.split(b"\n")
        tail = lines.pop()  # empty after a final newline, else a line cut by a kill
        kept = len(data) - len(tail)
        if tail and not _torn(tail):
            raise OutputFileError(f"{self.path} ends with text that is not a JSON line: it is not the output of a "
                                  f"batch job (choose another output file)")
        if lines and b"\0" in lines[-1]:  # the zeros a power loss can leave, newline included
            kept -= len(lines.pop()) + 1
        for number, raw in enumerate(lines, 1):
            record = _record(raw)
            if record is None:
                raise OutputFileError(f"{self.path} line {number} is not a JSON object: it is not the output of a "
                                      f"batch job (choose another output file)")
            key = key_of(record)
            if key is None:
                raise OutputFileError(f"{self.path} line {number} names no request: it is not the output of this "
                                      f"kind of job (choose another output file)")
            self.done.add(key)
        if kept < len(data):
            self.num_torn_bytes = len(data) - kept
            logger.warning("%s: the last %d bytes were a torn line; cut off, that request runs again",
                           self.path, self.num_torn_bytes)
            os.ftruncate(self._fd, kept)
            os.fsync(self._fd)

    def append(self, key: LineKey, record: dict[str, Any]) -> None:
        """Write one record as one whole line; a key already written is refused (ValueError)."""
        if key in self.done:
            raise ValueError(f"{key!r} is already in {self.path}")
        data = json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        try:
            written = os.write(self._fd, data)
            while written < len(data):  # a regular file takes it whole, unless the disk is full
                written += os.write(self._fd, data[written:])
        except OSError as e:
            raise OutputFileError(f"cannot write {self.path}: {e.strerror}") from None
        self.done.add(key)
        self._unsynced = True
        if time.monotonic() - self._last_sync >= self.sync_interval_s:
            self.sync()

    def sync(self) -> None:
        if self._unsynced:
            os.fsync(self._fd)
            self._unsynced = False
        self._last_sync = time.monotonic()

    def close(self) -> None:
        if self._fd < 0:
            return
        try:
            self.sync()
        finally:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> OutputFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _torn(tail: bytes) -> bool:
    """Whether the bytes after the last newline are what a kill or a power loss leaves of a record:
    the start of one (records are JSON objects) or zeros."""
    return tail.startswith(b"{") or not tail.strip(b"\0")


def _record(raw: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) else None
