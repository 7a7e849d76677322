"""What the client raises: one exception class per gRPC status the server answers with.

Every status error carries the server's message unchanged (`message`) and, for INVALID_ARGUMENT,
the fields it names (`field_violations`, from the google.rpc.BadRequest the server puts in the
`grpc-status-details-bin` trailer); a refusal about load carries the server's retry delay
(`retry_after_s`, from its google.rpc.RetryInfo). A client-side failure to connect is UNAVAILABLE too, and so is
a stream reset with no status (see `from_rpc_error`).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

import grpc
from google.rpc import error_details_pb2, status_pb2

if TYPE_CHECKING:
    from formwork_client._gen.formwork.v1 import generation_pb2 as pb

_STATUS_DETAILS_KEY = "grpc-status-details-bin"
# in what gRPC reports for an HTTP/2 RST_STREAM that ended a call before any status arrived, e.g.
# "Stream removed (RST_STREAM (Received RST_STREAM with error code 2))" from Envoy
_RESET_DETAILS = "Received RST_STREAM"


class FieldViolation(NamedTuple):
    field: str  # the request field's path, e.g. "constraint.json_schema_text" or "chat.messages[1].role"
    description: str


class FormworkError(Exception):
    """Base of everything this package raises about a call."""


class StatusError(FormworkError):
    """The call ended with a gRPC status other than OK."""

    def __init__(self, code: grpc.StatusCode, message: str, field_violations: Iterable[FieldViolation] = (),
                 retry_after_s: float | None = None) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message  # the server's message, as sent
        self.field_violations = tuple(field_violations)
        self.retry_after_s = retry_after_s  # set when the server says the same call may succeed after this long


class InvalidArgumentError(StatusError):
    """A bad parameter, schema, regex or grammar, or a prompt longer than the context."""


class ResourceExhaustedError(StatusError):
    """The server is overloaded (its queue is full, the engine is short of memory, or the API key has
    its limit of calls in flight: `retry_after_s` is set), or the request needs more KV cache than
    the engine has (it is not)."""


class UnavailableError(StatusError):
    """The model is still loading, the engine died, the server is shutting down, it cannot be
    reached, or it went away in the middle of the call (a stream reset without a status)."""


class UnauthenticatedError(StatusError):
    """The server needs an API key and the call carried none, or a wrong one (api_key=, $FORMWORK_API_KEY)."""


class DeadlineExceededError(StatusError):
    """The call's timeout passed; the server aborted the request."""


class RequestCancelledError(StatusError):
    """The call was cancelled (gRPC CANCELLED); not asyncio.CancelledError, which passes through."""


class InternalError(StatusError):
    """The server failed: generation broke off after it started, or a bug."""


class IncompleteOutputError(FormworkError):
    """extract(): the output ended before the schema's JSON was complete (max_tokens or the context
    length ran out, or the server cancelled the request while shutting down)."""

    def __init__(self, response: pb.GenerateResponse, finish_reason: str) -> None:
        super().__init__(f"the output ended with {finish_reason} after {response.usage.completion_tokens} tokens, "
                         f"before the JSON was complete; raise max_tokens or bound the schema's strings and arrays "
                         f"(maxLength, maxItems)")
        self.response = response
        self.finish_reason = finish_reason
        self.text = response.text  # the incomplete JSON text


_ERROR_CLASSES: dict[grpc.StatusCode, type[StatusError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.CANCELLED: RequestCancelledError,
    grpc.StatusCode.INTERNAL: InternalError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
}


def is_transient(error: FormworkError) -> bool:
    """Whether the same call sent again later may succeed: UNAVAILABLE (the server is loading,
    restarting, unreachable, or went away mid-call), and RESOURCE_EXHAUSTED when the server says it
    is overloaded (it sends a retry delay). A request too large for the engine's KV cache is
    RESOURCE_EXHAUSTED without one: it never succeeds, so it is not transient."""
    if not isinstance(error, StatusError):
        return False
    if error.code == grpc.StatusCode.UNAVAILABLE:
        return True
    return error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and error.retry_after_s is not None


def from_rpc_error(error: grpc.RpcError) -> StatusError:
    """The typed exception for a failed call (sync or asyncio); codes without a class of their own
    (e.g. UNIMPLEMENTED from a server without this API) are a plain StatusError. An HTTP/2 reset
    that ended the call without a status is UnavailableError, as for a server that cannot be
    reached: the server went away, and the call may be sent again."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    message = (error.details() if hasattr(error, "details") else None) or str(error)
    if code == grpc.StatusCode.INTERNAL and _RESET_DETAILS in message:
        # A Formwork server ends every call with a status; a reset without one means the server
        # (or the connection to it) went away mid-call: a proxy such as Envoy can only reset a
        # stream whose replica died after the first output, and gRPC calls that INTERNAL.
        return UnavailableError(grpc.StatusCode.UNAVAILABLE,
                                f"the call was cut off before it finished (the server or the connection to it "
                                f"went away): {message}")
    trailers = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    return _ERROR_CLASSES.get(code, StatusError)(code, message, *_status_details(trailers))


def _status_details(trailers) -> tuple[list[FieldViolation], float | None]:
    """The field violations and the retry delay in the google.rpc.Status of the trailers."""
    violations: list[FieldViolation] = []
    retry_after_s = None
    for key, value in trailers or ():
        if key != _STATUS_DETAILS_KEY:
            continue
        for detail in status_pb2.Status.FromString(value).details:
            bad_request = error_details_pb2.BadRequest()
            retry_info = error_details_pb2.RetryInfo()
            if detail.Unpack(bad_request):
                violations += [FieldViolation(v.field, v.description) for v in bad_request.field_violations]
            elif detail.Unpack(retry_info):
                retry_after_s = retry_info.retry_delay.ToNanoseconds() / 1e9
    return violations, retry_after_s
