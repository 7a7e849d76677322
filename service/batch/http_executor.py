"""An Executor that POSTs each body to an OpenAI-compatible HTTP server (Formwork's or a peer's).

Blocking `http.client` connections, one per worker thread and kept alive, on a pool as large as
the job's concurrency: the standard library only, nothing for the job to install.
"""
from __future__ import annotations

import asyncio
import http.client
import json
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from service.batch.executor import Executor, ExecutorUnavailable


class HttpExecutor(Executor):
    def __init__(self, base_url: str, *, concurrency: int = 64, api_key: str | None = None,
                 timeout_s: float = 600.0) -> None:
        """`base_url`: http(s)://host:port, with or without a trailing /v1 (the request lines'
        urls already start with /v1)."""
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"the server's address must be http://host:port or https://host:port, got {base_url!r}")
        self.base_url = base_url
        self._https = parsed.scheme == "https"
        self._host = parsed.hostname
        self._port = parsed.port
        self._prefix = parsed.path.rstrip("/").removesuffix("/v1")
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout_s = timeout_s
        self.preferred_concurrency = concurrency
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="batch-http")
        self._local = threading.local()

    async def execute(self, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._post, url, json.dumps(body))

    async def aclose(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _connection(self) -> http.client.HTTPConnection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            connection = self._local.connection = kind(self._host, self._port, timeout=self._timeout_s)
        return connection

    def _post(self, url: str, data: str) -> tuple[int, dict[str, Any]]:
        connection = self._connection()
        try:
            connection.request("POST", self._prefix + url, body=data.encode(), headers=self._headers)
            response = connection.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException) as e:
            connection.close()
            self._local.connection = None
            raise ExecutorUnavailable(f"{self.base_url}: {e or type(e).__name__}") from None
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            text = raw[:200].decode(errors="replace")
            body = {"error": {"message": f"the server answered {response.status} with a body that is not a JSON "
                                         f"object: {text!r}", "type": "invalid_response", "param": None,
                              "code": None}}
        return response.status, body
