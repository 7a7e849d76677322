"""OpenAI's Batches API: a file of requests answered in the background, at low priority.

    POST /v1/batches                 create (input_file_id, endpoint, completion_window "24h", metadata)
    GET  /v1/batches                 list, newest first (after, limit)
    GET  /v1/batches/{batch_id}      a Batch object (status, request_counts, output and error files)
    POST /v1/batches/{batch_id}/cancel   stop it; what was answered stays in its files

The input file is checked when the batch is created: a file with a bad line is not run, and the
batch comes back `failed` with the problems in `errors`. service/batch/worker.py runs the rest.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pydantic
from fastapi import FastAPI, Request
from fastapi.responses import Response

from service.batch.api_config import COMPLETION_WINDOW_S
from service.http.answerer import GENERATION_PATHS, Refused, parsed_body
from service.http.batch_objects import batch_object, list_limit, list_object
from service.http.errors import bad_request, not_found, too_large
from service.http.streaming import encode_json

if TYPE_CHECKING:
    from service.batch.store import BatchStore, StoredBatch
    from service.batch.worker import BatchWorker

_MAX_BODY_BYTES = 64 << 10
_MAX_METADATA_KEYS, _MAX_METADATA_KEY_CHARS, _MAX_METADATA_VALUE_CHARS = 16, 64, 512


class BatchCreateRequest(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True)

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None


class BatchRoutes:
    """The /v1/batches routes; `authorize` raises Refused (401) for a caller without a valid key."""

    def __init__(self, store: BatchStore, worker: BatchWorker, authorize: Callable[[Request], object]) -> None:
        self._store = store
        self._worker = worker
        self._authorize = authorize

    def register(self, app: FastAPI) -> None:
        app.add_api_route("/v1/batches", self.create, methods=["POST"])
        app.add_api_route("/v1/batches", self.list, methods=["GET"])
        app.add_api_route("/v1/batches/{batch_id}", self.retrieve, methods=["GET"])
        app.add_api_route("/v1/batches/{batch_id}/cancel", self.cancel, methods=["POST"])

    async def create(self, request: Request) -> Response:
        self._authorize(request)
        body = await request.body()
        if len(body) > _MAX_BODY_BYTES:
            raise Refused(too_large(f"the request body is {len(body)} bytes; a batch is created with at most "
                                    f"{_MAX_BODY_BYTES}"))
        create = parsed_body(BatchCreateRequest, body, unsupported_by="this server's Batches API")
        if create.endpoint not in GENERATION_PATHS:
            raise Refused(bad_request(f"endpoint: this server runs batches for {', '.join(GENERATION_PATHS)}, "
                                      f"got {create.endpoint!r}", "endpoint"))
        window_s = COMPLETION_WINDOW_S.get(create.completion_window)
        if window_s is None:
            raise Refused(bad_request(f"completion_window: must be one of {', '.join(COMPLETION_WINDOW_S)}, got "
                                      f"{create.completion_window!r}", "completion_window"))
        _check_metadata(create.metadata)
        input_file = self._store.file(create.input_file_id)
        if input_file is None:
            raise Refused(not_found(f"input_file_id: no file {create.input_file_id!r} on this server",
                                    "file_not_found"))
        if input_file.purpose != "batch":
            raise Refused(bad_request(f"input_file_id: the file {input_file.id} has purpose "
                                      f"{input_file.purpose!r}; a batch reads a file uploaded with purpose 'batch'",
                                      "input_file_id"))
        batch = self._store.add_batch(create.endpoint, input_file.id, create.completion_window, window_s,
                                      create.metadata)
        batch = await self._worker.validate(batch)
        self._worker.wake()
        return _json(batch_object(batch))

    async def list(self, request: Request) -> Response:
        self._authorize(request)
        query = request.query_params
        limit = list_limit(query.get("limit"), 20, 100)
        after = query.get("after")
        try:
            page = self._store.batches(limit, after)
        except KeyError:
            raise Refused(bad_request(f"after: no batch {after!r} on this server", "after")) from None
        return _json(list_object(page, batch_object))

    async def retrieve(self, request: Request, batch_id: str) -> Response:
        self._authorize(request)
        return _json(batch_object(self._batch(batch_id)))

    async def cancel(self, request: Request, batch_id: str) -> Response:
        self._authorize(request)
        try:
            return _json(batch_object(self._worker.cancel(batch_id)))
        except KeyError:
            raise _no_batch(batch_id) from None
        except ValueError as e:
            raise Refused(bad_request(str(e))) from None

    def _batch(self, batch_id: str) -> StoredBatch:
        batch = self._store.batch(batch_id)
        if batch is None:
            raise _no_batch(batch_id)
        return batch


def _check_metadata(metadata: dict[str, str] | None) -> None:
    """OpenAI's bounds on metadata: 16 pairs, keys of 64 characters, values of 512."""
    if metadata is None:
        return
    if len(metadata) > _MAX_METADATA_KEYS:
        raise Refused(bad_request(f"metadata: at most {_MAX_METADATA_KEYS} pairs, got {len(metadata)}", "metadata"))
    for key, value in metadata.items():
        if len(key) > _MAX_METADATA_KEY_CHARS or len(value) > _MAX_METADATA_VALUE_CHARS:
            raise Refused(bad_request(f"metadata: keys have at most {_MAX_METADATA_KEY_CHARS} characters and values "
                                      f"{_MAX_METADATA_VALUE_CHARS}; {key[:70]!r} is over", "metadata"))


def _no_batch(batch_id: str) -> Refused:
    return Refused(not_found(f"no batch {batch_id!r} on this server", "batch_not_found"))


def _json(body: dict) -> Response:
    return Response(encode_json(body), status_code=200, media_type="application/json")
