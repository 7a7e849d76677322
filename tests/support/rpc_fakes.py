"""A failed gRPC call as grpc raises it, for testing how a client reads one without a server."""
from __future__ import annotations

import grpc


class FakeRpcError(grpc.RpcError):
    """`code`, `details` and the trailing metadata (key, value) pairs a server would send."""

    def __init__(self, code: grpc.StatusCode, details: str, trailers=()) -> None:
        self._code, self._details, self._trailers = code, details, trailers

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._trailers
