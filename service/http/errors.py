"""ServiceErrors as OpenAI error responses: `{"error": {"message", "type", "param", "code"}}` and
the HTTP status a client of the OpenAI API expects for it."""
from __future__ import annotations

import math
from dataclasses import dataclass

from service.errors import ErrorCode, ServiceError

# a constraint over the size limit (INVALID_ARGUMENT) and a request the KV cache cannot hold
# (RESOURCE_EXHAUSTED) are too large (413); a full queue or key limit is RESOURCE_EXHAUSTED too (429)
_TOO_LARGE_MARKERS = ("max_constraint_bytes", "needs KV cache for up to")

_STATUS = {
    ErrorCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    ErrorCode.UNAUTHENTICATED: (401, "authentication_error"),
    ErrorCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    ErrorCode.CANCELLED: (499, "cancelled"),
    ErrorCode.INTERNAL: (500, "internal_error"),
    ErrorCode.UNAVAILABLE: (503, "service_unavailable"),
    ErrorCode.DEADLINE_EXCEEDED: (504, "timeout"),
}


@dataclass(frozen=True)
class HttpError:
    status: int
    message: str
    type: str
    param: str | None = None
    code: str | None = None
    retry_after_s: float | None = None  # sent as Retry-After (whole seconds) when set

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def http_error(error: ServiceError, param: str | None = None) -> HttpError:
    status, kind = _STATUS[error.code]
    if error.code in (ErrorCode.INVALID_ARGUMENT, ErrorCode.RESOURCE_EXHAUSTED) and any(
            marker in error.message for marker in _TOO_LARGE_MARKERS):
        status, kind = 413, "request_too_large"
    if param is None and error.violations:
        param = error.violations[0].field
    return HttpError(status, error.message, kind, param, error.code.name.lower(), error.retry_after_s)


def not_found(message: str, code: str = "not_found") -> HttpError:
    return HttpError(404, message, "not_found_error", None, code)


def too_large(message: str, param: str | None = None) -> HttpError:
    return HttpError(413, message, "request_too_large", param, "request_too_large")


def bad_request(message: str, param: str | None = None) -> HttpError:
    return HttpError(400, message, "invalid_request_error", param, "invalid_argument")
