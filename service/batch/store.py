"""The server's files and batches under its data directory: contents as files, everything else in SQLite.

    DATA_DIR/formwork.sqlite3     files' and batches' metadata, batch state and request counts
    DATA_DIR/files/FILE_ID        a file's bytes (uploads, and the output and error files of batches)
    DATA_DIR/results/BATCH_ID.jsonl   a running batch's answers, appended line by line (the runner's)
    DATA_DIR/staging/             files being written; moved into files/ whole

The only module that opens the database. Every change is one transaction (WAL journal): a process
killed at any moment leaves the last committed state, and a file moved into files/ but whose row
never committed is swept away on the next open. Safe to call from several threads.
"""
from __future__ import annotations

import fcntl
import json
import os
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.batch.batch_status import BatchStatus

_SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- creation order, for listing
    id TEXT NOT NULL UNIQUE,
    bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    filename TEXT NOT NULL,
    purpose TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    endpoint TEXT NOT NULL,
    input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    in_progress_at INTEGER, finalizing_at INTEGER, completed_at INTEGER, failed_at INTEGER,
    expired_at INTEGER, cancelling_at INTEGER, cancelled_at INTEGER,
    output_file_id TEXT,
    error_file_id TEXT,
    errors TEXT,  -- JSON: the validation errors, [{code, message, param, line}]
    num_total INTEGER NOT NULL DEFAULT 0,
    num_completed INTEGER NOT NULL DEFAULT 0,
    num_failed INTEGER NOT NULL DEFAULT 0,
    metadata TEXT,  -- JSON object, or NULL
    usage TEXT  -- JSON: the answered lines' tokens, once finished
);
"""

class DataDirInUse(ValueError):
    """Another process holds the data directory."""


@dataclass(frozen=True)
class StoredFile:
    id: str  # "file-..."
    bytes: int
    created_at: int  # Unix seconds
    filename: str
    purpose: str  # "batch" for inputs; "batch_output" for what a batch wrote


@dataclass(frozen=True)
class RequestCounts:
    total: int = 0  # lines in the input
    completed: int = 0  # lines answered 2xx
    failed: int = 0  # lines answered with an error


@dataclass(frozen=True)
class StoredBatch:
    id: str  # "batch_..."
    endpoint: str
    input_file_id: str
    completion_window: str
    status: BatchStatus
    created_at: int
    expires_at: int
    # status -> Unix seconds it was entered (the Batch object's `<status>_at` fields)
    timestamps: dict[str, int]
    output_file_id: str | None
    error_file_id: str | None
    errors: list[dict[str, Any]] | None  # validation errors: {code, message, param, line}
    request_counts: RequestCounts
    metadata: dict[str, str] | None
    usage: dict[str, Any] | None  # tokens of the answered lines (OpenAI's Batch usage), once finished


@dataclass(frozen=True)
class Page:
    items: list[Any]
    has_more: bool


class BatchStore:
    """Files and batches persisted under `data_dir` (created if missing)."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.data_dir = Path(data_dir)
        self._files_dir = self.data_dir / "files"
        self._results_dir = self.data_dir / "results"
        self._staging_dir = self.data_dir / "staging"
        for directory in (self._files_dir, self._results_dir, self._staging_dir):
            directory.mkdir(parents=True, exist_ok=True)
        # one server a data directory: two would run the same batches (released when the process dies)
        self._lock_file = open(self.data_dir / "lock", "w")  # noqa: SIM115 - held for the store's life
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise DataDirInUse(f"{self.data_dir} is in use by another server (each needs its own --data-dir)") from None
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.data_dir / "formwork.sqlite3", check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # with WAL: durable across a killed process
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, _SCHEMA_VERSION):
            raise ValueError(f"{self.data_dir}: its database has schema version {version}; this Formwork reads "
                             f"version {_SCHEMA_VERSION} (use another --data-dir)")
        self._db.executescript(_SCHEMA)
        self._db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
        self._sweep()

    def close(self) -> None:
        with self._lock:
            self._db.close()
        self._lock_file.close()

    # ---- files --------------------------------------------------------------------------------

    def add_file(self, content: bytes, filename: str, purpose: str, now: int | None = None) -> StoredFile:
        """Store `content` as a new file; its bytes are on disk before its row exists."""
        staged = self.staged_path()
        with open(staged, "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        return self.add_staged_file(staged, filename, purpose, now)

    def staged_path(self) -> Path:
        """A fresh path in the staging folder, for a file written before it is added."""
        return self._staging_dir / f"{secrets.token_hex(8)}.part"

    def add_staged_file(self, staged: Path, filename: str, purpose: str, now: int | None = None) -> StoredFile:
        """Move a written staging file into the store as a new file."""
        with self._lock, self._transaction():
            return self._add_staged(staged, filename, purpose, _now(now))

    def file(self, file_id: str) -> StoredFile | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM files WHERE id = ?", (file_id,)).fetchone()
        return _file(row) if row is not None else None

    def file_path(self, file_id: str) -> Path:
        return self._files_dir / file_id

    def files(self, limit: int, after: str | None = None, purpose: str | None = None,
              newest_first: bool = True) -> Page:
        """Up to `limit` files after the file `after` (in listing order), optionally of one purpose."""
        query, params = "SELECT * FROM files WHERE 1", []
        if purpose is not None:
            query += " AND purpose = ?"
            params.append(purpose)
        return self._page("files", query, params, limit, after, newest_first, _file)

    def delete_file(self, file_id: str) -> bool:
        """Remove a file; False if there is none. Raises ValueError while an unfinished batch reads it."""
        with self._lock, self._transaction():
            if self._db.execute("SELECT 1 FROM files WHERE id = ?", (file_id,)).fetchone() is None:
                return False
            reader = self._db.execute(
                "SELECT id, status FROM batches WHERE input_file_id = ? AND status NOT IN (?, ?, ?, ?)",
                (file_id, *(s.value for s in BatchStatus if s.is_finished))).fetchone()
            if reader is not None:
                raise ValueError(f"the file {file_id} is the input of the batch {reader['id']}, which is "
                                 f"{reader['status']}; cancel it or wait for it to finish first")
            self._db.execute("DELETE FROM files WHERE id = ?", (file_id,))
        self.file_path(file_id).unlink(missing_ok=True)
        return True

    # ---- batches ------------------------------------------------------------------------------

    def add_batch(self, endpoint: str, input_file_id: str, completion_window: str, window_s: int,
                  metadata: dict[str, str] | None, now: int | None = None) -> StoredBatch:
        """A new batch, `validating`, expiring `window_s` after now."""
        created_at = _now(now)
        batch_id = f"batch_{secrets.token_hex(12)}"
        with self._lock, self._transaction():
            self._db.execute(
                "INSERT INTO batches (id, endpoint, input_file_id, completion_window, status, created_at, expires_at, "
                "metadata) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (batch_id, endpoint, input_file_id, completion_window, BatchStatus.VALIDATING.value, created_at,
                 created_at + window_s, json.dumps(metadata) if metadata is not None else None))
            return self._batch(batch_id)

    def batch(self, batch_id: str) -> StoredBatch | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM batches WHERE id = ?", (batch_id,)).fetchone()
        return _batch(row) if row is not None else None

    def batches(self, limit: int, after: str | None = None) -> Page:
        """Up to `limit` batches, newest first, after the batch `after`."""
        return self._page("batches", "SELECT * FROM batches WHERE 1", [], limit, after, True, _batch)

    def unfinished_batches(self) -> list[StoredBatch]:
        """Batches with work left, oldest first."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM batches WHERE status NOT IN (?, ?, ?, ?) ORDER BY seq",
                                    tuple(s.value for s in BatchStatus if s.is_finished)).fetchall()
        return [_batch(row) for row in rows]

    def move(self, batch_id: str, status: BatchStatus, now: int | None = None,
             errors: list[dict[str, Any]] | None = None, num_total: int | None = None) -> StoredBatch:
        """Move a batch to `status` (stamping `<status>_at`); ValueError if its status does not allow it."""
        with self._lock, self._transaction():
            current = self._batch(batch_id)
            current.status.check_move(status)
            self._set(batch_id, status, _now(now), errors=json.dumps(errors) if errors is not None else None,
                      num_total=num_total)
            return self._batch(batch_id)

    def set_counts(self, batch_id: str, num_completed: int, num_failed: int) -> None:
        with self._lock, self._transaction():
            self._db.execute("UPDATE batches SET num_completed = ?, num_failed = ? WHERE id = ?",
                             (num_completed, num_failed, batch_id))

    def results_path(self, batch_id: str) -> Path:
        """Where a running batch's answers are appended."""
        return self._results_dir / f"{batch_id}.jsonl"

    def finish(self, batch_id: str, status: BatchStatus, output: Path | None, error: Path | None,
               counts: RequestCounts, usage: dict[str, Any] | None = None, now: int | None = None) -> StoredBatch:
        """End a batch in one transaction: its staged output and error files (None: no lines of that
        kind) become files of purpose `batch_output`, its counts and `status` are set. Its results
        file is removed after."""
        stamp = _now(now)
        with self._lock, self._transaction():
            current = self._batch(batch_id)
            current.status.check_move(status)
            output_id = error_id = None
            if output is not None:
                output_id = self._add_staged(output, f"{batch_id}_output.jsonl", "batch_output", stamp).id
            if error is not None:
                error_id = self._add_staged(error, f"{batch_id}_error.jsonl", "batch_output", stamp).id
            self._set(batch_id, status, stamp, output_file_id=output_id, error_file_id=error_id,
                      num_total=counts.total, num_completed=counts.completed, num_failed=counts.failed,
                      usage=json.dumps(usage) if usage is not None else None)
            finished = self._batch(batch_id)
        self.results_path(batch_id).unlink(missing_ok=True)
        return finished

    # ---- inside ---------------------------------------------------------------------------------

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)

    def _add_staged(self, staged: Path, filename: str, purpose: str, now: int) -> StoredFile:
        file_id = f"file-{secrets.token_hex(12)}"
        size = staged.stat().st_size
        os.replace(staged, self.file_path(file_id))  # a crash before the commit leaves it to _sweep
        self._db.execute("INSERT INTO files (id, bytes, created_at, filename, purpose) VALUES (?, ?, ?, ?, ?)",
                         (file_id, size, now, filename, purpose))
        return StoredFile(file_id, size, now, filename, purpose)

    def _set(self, batch_id: str, status: BatchStatus, now: int, **fields: Any) -> None:
        values = {"status": status.value, **{k: v for k, v in fields.items() if v is not None}}
        if status.timestamp_field is not None:
            values[status.timestamp_field] = now
        assignments = ", ".join(f"{column} = ?" for column in values)
        self._db.execute(f"UPDATE batches SET {assignments} WHERE id = ?", (*values.values(), batch_id))

    def _batch(self, batch_id: str) -> StoredBatch:
        row = self._db.execute("SELECT * FROM batches WHERE id = ?", (batch_id,)).fetchone()
        if row is None:
            raise KeyError(batch_id)
        return _batch(row)

    def _page(self, table: str, query: str, params: list[Any], limit: int, after: str | None, newest_first: bool,
              convert: Any) -> Page:
        with self._lock:
            if after is not None:
                anchor = self._db.execute(f"SELECT seq FROM {table} WHERE id = ?", (after,)).fetchone()
                if anchor is None:
                    raise KeyError(after)
                query += " AND seq < ?" if newest_first else " AND seq > ?"
                params = [*params, anchor["seq"]]
            query += f" ORDER BY seq {'DESC' if newest_first else 'ASC'} LIMIT ?"
            rows = self._db.execute(query, (*params, limit + 1)).fetchall()
        return Page([convert(row) for row in rows[:limit]], len(rows) > limit)

    def _sweep(self) -> None:
        """Drop staged leftovers and files whose row never committed (a process killed mid-write)."""
        for leftover in self._staging_dir.iterdir():
            leftover.unlink(missing_ok=True)
        known = {row[0] for row in self._db.execute("SELECT id FROM files")}
        for path in self._files_dir.iterdir():
            if path.name not in known:
                path.unlink(missing_ok=True)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on an exception."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self._db.execute("COMMIT" if kind is None else "ROLLBACK")


def _now(now: int | None) -> int:
    return int(time.time()) if now is None else now


def _file(row: sqlite3.Row) -> StoredFile:
    return StoredFile(row["id"], row["bytes"], row["created_at"], row["filename"], row["purpose"])


def _batch(row: sqlite3.Row) -> StoredBatch:
    timestamps = {s.timestamp_field: row[s.timestamp_field] for s in BatchStatus
                  if s.timestamp_field is not None and row[s.timestamp_field] is not None}
    return StoredBatch(
        id=row["id"], endpoint=row["endpoint"], input_file_id=row["input_file_id"],
        completion_window=row["completion_window"], status=BatchStatus(row["status"]), created_at=row["created_at"],
        expires_at=row["expires_at"], timestamps=timestamps, output_file_id=row["output_file_id"],
        error_file_id=row["error_file_id"], errors=json.loads(row["errors"]) if row["errors"] else None,
        request_counts=RequestCounts(row["num_total"], row["num_completed"], row["num_failed"]),
        metadata=json.loads(row["metadata"]) if row["metadata"] else None,
        usage=json.loads(row["usage"]) if row["usage"] else None)
