"""The Files and Batches APIs' objects as OpenAI's API writes them: File, Batch, a list page, a deletion."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service.batch.batch_status import BatchStatus
from service.batch.store import Page, StoredBatch, StoredFile
from service.http.answerer import Refused
from service.http.errors import bad_request


def file_object(stored: StoredFile) -> dict[str, Any]:
    return {"id": stored.id, "object": "file", "bytes": stored.bytes, "created_at": stored.created_at,
            "filename": stored.filename, "purpose": stored.purpose, "status": "processed", "expires_at": None,
            "status_details": None}


def file_deleted(file_id: str) -> dict[str, Any]:
    return {"id": file_id, "object": "file", "deleted": True}


def batch_object(stored: StoredBatch) -> dict[str, Any]:
    timestamps = {status.timestamp_field: stored.timestamps.get(status.timestamp_field)
                  for status in BatchStatus if status.timestamp_field is not None}
    counts = stored.request_counts
    return {
        "id": stored.id, "object": "batch", "endpoint": stored.endpoint,
        "errors": {"object": "list", "data": stored.errors} if stored.errors else None,
        "input_file_id": stored.input_file_id, "completion_window": stored.completion_window,
        "status": stored.status.value, "output_file_id": stored.output_file_id,
        "error_file_id": stored.error_file_id, "created_at": stored.created_at, "expires_at": stored.expires_at,
        **timestamps,
        "request_counts": {"total": counts.total, "completed": counts.completed, "failed": counts.failed},
        "metadata": stored.metadata, "usage": stored.usage,
    }


def list_object(page: Page, convert: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    data = [convert(item) for item in page.items]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": page.has_more}


def list_limit(text: str | None, default: int, maximum: int) -> int:
    """A list's `limit` query parameter, 1..maximum; Refused (400) otherwise."""
    if text is None:
        return default
    if not text.isdigit() or not 1 <= int(text) <= maximum:
        raise Refused(bad_request(f"limit: must be an integer from 1 to {maximum}, got {text!r}", "limit"))
    return int(text)
