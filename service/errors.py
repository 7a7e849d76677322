"""Errors the service answers with, whichever front end a request came through: a kind, a precise
message, and the request fields at fault.

No wire format here: service/grpc/status.py turns a ServiceError into a gRPC status (with the
field violations as rich details), service/http/errors.py into an OpenAI error body and its HTTP
status.
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.protocol import ErrorKind

if TYPE_CHECKING:
    from engine.frontend.output_processor import RequestOutput


class ErrorCode(enum.Enum):
    """Why a request failed, named as the canonical error codes (google.rpc.Code) name them: the
    metrics label refusals with these names on both front ends."""

    CANCELLED = enum.auto()
    INVALID_ARGUMENT = enum.auto()
    DEADLINE_EXCEEDED = enum.auto()
    RESOURCE_EXHAUSTED = enum.auto()
    INTERNAL = enum.auto()
    UNAVAILABLE = enum.auto()
    UNAUTHENTICATED = enum.auto()


@dataclass(frozen=True)
class FieldViolation:
    field: str  # the request field's path, e.g. "constraint.json_schema" or "chat.messages[1].role"
    description: str


class ServiceError(Exception):
    """A request the service refuses or could not complete."""

    def __init__(self, code: ErrorCode, message: str, violations: Sequence[FieldViolation] = (),
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.violations = tuple(violations)
        # set when the refusal is about load, not the request: the same call may succeed after this
        # long (gRPC: a google.rpc.RetryInfo detail; HTTP: Retry-After)
        self.retry_after_s = retry_after_s


def invalid_argument(field: str, description: str) -> ServiceError:
    """INVALID_ARGUMENT naming one field: message "field: description", and a field violation."""
    return ServiceError(ErrorCode.INVALID_ARGUMENT, f"{field}: {description}", [FieldViolation(field, description)])


# how long an overloaded server asks a client to wait: about the time a batch of short requests
# takes to finish and free its slots here
OVERLOADED_RETRY_AFTER_S = 1.0


def overloaded(message: str) -> ServiceError:
    """RESOURCE_EXHAUSTED about load (a full queue, the engine short of memory, a key's calls in
    flight): transient, so it carries a retry delay; a request too large for the engine is
    RESOURCE_EXHAUSTED without one, as it never succeeds."""
    return ServiceError(ErrorCode.RESOURCE_EXHAUSTED, message, retry_after_s=OVERLOADED_RETRY_AFTER_S)


def unavailable(message: str) -> ServiceError:
    return ServiceError(ErrorCode.UNAVAILABLE, message)


def error_from_output(output: RequestOutput, constraint_field: str | None) -> ServiceError:
    """The error for an output that ended with FinishReason.ERROR.

    Before any token, the request itself was at fault (its grammar did not compile, or the core
    refused it): INVALID_ARGUMENT, naming the constraint if there is one. After tokens, the
    constraint's fault (a grammar limit, its grammar work failed) is still INVALID_ARGUMENT; any
    other failure mid-generation (e.g. a grammar dead end) is INTERNAL. Only this request ends.
    """
    error = output.error or "the engine ended the request with an error"
    if output.token_ids and output.error_kind == ErrorKind.CONSTRAINT and constraint_field is not None:
        error = f"{error} (after {len(output.token_ids)} tokens)"
        return ServiceError(ErrorCode.INVALID_ARGUMENT, f"{constraint_field}: {error}",
                            [FieldViolation(constraint_field, error)])
    if output.token_ids:
        return ServiceError(ErrorCode.INTERNAL, f"generation failed after {len(output.token_ids)} tokens: {error}")
    if constraint_field is not None:
        return ServiceError(ErrorCode.INVALID_ARGUMENT, f"{constraint_field}: {error}",
                            [FieldViolation(constraint_field, error)])
    return ServiceError(ErrorCode.INVALID_ARGUMENT, error)
