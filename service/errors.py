"""Errors the service answers with: a gRPC status code, a precise message, and rich details.

Works on plain protobuf messages: service/server.py turns a ServiceError into the RPC's status,
with the google.rpc.Status below in the `grpc-status-details-bin` trailer (what
`grpc_status.rpc_status.from_call` and grpcurl read).
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

STATUS_DETAILS_KEY = "grpc-status-details-bin"


class StatusCode(enum.Enum):
    """The gRPC codes this service answers with (value: the code's number)."""

    CANCELLED = 1
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    RESOURCE_EXHAUSTED = 8
    INTERNAL = 13
    UNAVAILABLE = 14
    UNAUTHENTICATED = 16


@dataclass(frozen=True)
class FieldViolation:
    field: str  # the request field's path, e.g. "constraint.json_schema" or "chat.messages[1].role"
    description: str


class ServiceError(Exception):
    """A request the service refuses or could not complete."""

    def __init__(self, code: StatusCode, message: str, violations: Sequence[FieldViolation] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.violations = tuple(violations)

    def status_proto(self) -> status_pb2.Status:
        """The google.rpc.Status: code, message, and a BadRequest listing the field violations."""
        status = status_pb2.Status(code=self.code.value, message=self.message)
        if self.violations:
            bad_request = error_details_pb2.BadRequest(field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
                for v in self.violations])
            detail = any_pb2.Any()
            detail.Pack(bad_request)
            status.details.append(detail)
        return status


def invalid_argument(field: str, description: str) -> ServiceError:
    """INVALID_ARGUMENT naming one field: message "field: description", and a field violation."""
    return ServiceError(StatusCode.INVALID_ARGUMENT, f"{field}: {description}", [FieldViolation(field, description)])


def unavailable(message: str) -> ServiceError:
    return ServiceError(StatusCode.UNAVAILABLE, message)
