"""OpenAI's Files API over the batch store: the files batches read and write.

    POST   /v1/files                  upload (multipart/form-data: `file`, `purpose` "batch")
    GET    /v1/files                  list, newest first (after, limit, order, purpose)
    GET    /v1/files/{file_id}        a File object
    GET    /v1/files/{file_id}/content   its bytes
    DELETE /v1/files/{file_id}        remove it (refused while an unfinished batch reads it)
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, Response

from service.http.answerer import Refused
from service.http.batch_objects import file_deleted, file_object, list_limit, list_object
from service.http.errors import bad_request, not_found, too_large
from service.http.multipart_form import parse_multipart
from service.http.streaming import encode_json

if TYPE_CHECKING:
    from service.batch.api_config import BatchApiConfig
    from service.batch.store import BatchStore, StoredFile

UPLOAD_PURPOSES = ("batch",)  # what this server stores files for
_FORM_OVERHEAD_BYTES = 64 << 10  # a form's boundaries and other fields, beside the file
_MAX_LIST_LIMIT = 10_000


class FileRoutes:
    """The /v1/files routes; `authorize` raises Refused (401) for a caller without a valid key."""

    def __init__(self, store: BatchStore, config: BatchApiConfig, authorize: Callable[[Request], object]) -> None:
        self._store = store
        self._max_file_bytes = config.max_file_bytes
        self._authorize = authorize

    def register(self, app: FastAPI) -> None:
        app.add_api_route("/v1/files", self.upload, methods=["POST"])
        app.add_api_route("/v1/files", self.list, methods=["GET"])
        app.add_api_route("/v1/files/{file_id}", self.retrieve, methods=["GET"])
        app.add_api_route("/v1/files/{file_id}/content", self.content, methods=["GET"])
        app.add_api_route("/v1/files/{file_id}", self.delete, methods=["DELETE"])

    async def upload(self, request: Request) -> Response:
        self._authorize(request)
        body = await self._form_body(request)
        try:
            form = parse_multipart(request.headers.get("content-type"), body)
        except ValueError as e:
            raise Refused(bad_request(f"the upload is not a valid form: {e}")) from None
        purpose = form.get("purpose")
        if purpose is None:
            raise Refused(bad_request("purpose: missing; send the form field 'purpose' (\"batch\")", "purpose"))
        purpose_text = purpose.content.decode("utf-8", "replace").strip()
        if purpose_text not in UPLOAD_PURPOSES:
            raise Refused(bad_request(f"purpose: this server stores files for batches only: it must be 'batch', "
                                      f"got {purpose_text!r}", "purpose"))
        upload = form.get("file")
        if upload is None or upload.filename is None:
            raise Refused(bad_request("file: missing; send the file as the form's 'file' field (with a filename)",
                                      "file"))
        if len(upload.content) > self._max_file_bytes:
            raise Refused(too_large(f"file: {len(upload.content)} bytes; this server's largest file is "
                                    f"{self._max_file_bytes} bytes", "file"))
        stored = await asyncio.to_thread(self._store.add_file, upload.content, upload.filename, purpose_text)
        return _json(200, file_object(stored))

    async def list(self, request: Request) -> Response:
        self._authorize(request)
        query = request.query_params
        limit = list_limit(query.get("limit"), _MAX_LIST_LIMIT, _MAX_LIST_LIMIT)
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise Refused(bad_request(f"order: must be 'asc' or 'desc', got {order!r}", "order"))
        after = query.get("after")
        try:
            page = self._store.files(limit, after, query.get("purpose"), newest_first=order == "desc")
        except KeyError:
            raise Refused(bad_request(f"after: no file {after!r} on this server", "after")) from None
        return _json(200, list_object(page, file_object))

    async def retrieve(self, request: Request, file_id: str) -> Response:
        self._authorize(request)
        return _json(200, file_object(self._file(file_id)))

    async def content(self, request: Request, file_id: str) -> Response:
        self._authorize(request)
        stored = self._file(file_id)
        return FileResponse(self._store.file_path(stored.id), media_type="application/octet-stream")

    async def delete(self, request: Request, file_id: str) -> Response:
        self._authorize(request)
        try:
            deleted = await asyncio.to_thread(self._store.delete_file, file_id)
        except ValueError as e:
            raise Refused(bad_request(str(e), "file_id")) from None
        if not deleted:
            raise _no_file(file_id)
        return _json(200, file_deleted(file_id))

    def _file(self, file_id: str) -> StoredFile:
        stored = self._store.file(file_id)
        if stored is None:
            raise _no_file(file_id)
        return stored

    async def _form_body(self, request: Request) -> bytes:
        """The whole body, refused (413) as soon as it passes the file limit plus the form's framing."""
        limit = self._max_file_bytes + _FORM_OVERHEAD_BYTES
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise Refused(too_large(f"the upload is {declared} bytes; this server's largest file is "
                                    f"{self._max_file_bytes} bytes", "file"))
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise Refused(too_large(f"the upload is over this server's largest file, {self._max_file_bytes} "
                                        f"bytes", "file"))
        return bytes(body)


def _no_file(file_id: str) -> Refused:
    return Refused(not_found(f"no file {file_id!r} on this server", "file_not_found"))


def _json(status: int, body: dict) -> Response:
    return Response(encode_json(body), status_code=status, media_type="application/json")
