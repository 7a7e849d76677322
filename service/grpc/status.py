"""ServiceErrors as gRPC statuses: the code, the message, and a google.rpc.Status with the field
violations in the `grpc-status-details-bin` trailer (what `grpc_status.rpc_status.from_call` and
grpcurl read)."""
from __future__ import annotations

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

from service.errors import ErrorCode, ServiceError

STATUS_DETAILS_KEY = "grpc-status-details-bin"

GRPC_CODE = {
    ErrorCode.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorCode.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorCode.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
}


def status_proto(error: ServiceError) -> status_pb2.Status:
    """The google.rpc.Status: code, message, a BadRequest listing the field violations, and a
    RetryInfo when the refusal is about load (clients retry on it, after its delay)."""
    status = status_pb2.Status(code=GRPC_CODE[error.code].value[0], message=error.message)
    if error.violations:
        _add_detail(status, error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
            for v in error.violations]))
    if error.retry_after_s is not None:
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(round(error.retry_after_s * 1e9))
        _add_detail(status, error_details_pb2.RetryInfo(retry_delay=delay))
    return status


def _add_detail(status: status_pb2.Status, message) -> None:
    detail = any_pb2.Any()
    detail.Pack(message)
    status.details.append(detail)


async def abort(context: grpc.aio.ServicerContext, error: ServiceError) -> None:
    """End the call with `error`'s code and message, its google.rpc.Status in the trailer."""
    details = status_proto(error).SerializeToString()
    await context.abort(GRPC_CODE[error.code], error.message, trailing_metadata=((STATUS_DETAILS_KEY, details),))
