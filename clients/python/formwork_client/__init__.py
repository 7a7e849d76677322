"""Python client for Formwork's gRPC API (formwork.v1.Generation): structured-output generation.

    from formwork_client import Client
    with Client("127.0.0.1:50051") as client:
        person = client.extract({"type": "object", ...}, "Ada Lovelace was born in 1815.")

`client.extract_many(documents, schema)` extracts from many documents, several calls at a time,
with a result (or an error) per document. `Client` is synchronous and thread-safe; `AsyncClient`
has the same calls for asyncio. Responses are the API's protobuf messages (`formwork_client.pb`); failures raise the StatusError subclass of
their gRPC code (`formwork_client.errors`).
"""
from formwork_client._gen.formwork.v1 import generation_pb2 as pb
from formwork_client.aio import AsyncClient
from formwork_client.client import Client
from formwork_client.constraints import (CONSTRAINT_KEY_HEADER, choice, constraint_key, grammar, json_object, json_schema,
                                         regex, structural_tag)
from formwork_client.errors import (DeadlineExceededError, FieldViolation, FormworkError, IncompleteOutputError,
                                    InternalError, InvalidArgumentError, RequestCancelledError,
                                    ResourceExhaustedError, StatusError, UnauthenticatedError, UnavailableError,
                                    is_transient)
from formwork_client.extraction import ExtractionResult, Usage
from formwork_client.request import DEFAULT_ADDRESS

__all__ = [
    "AsyncClient", "Client", "DEFAULT_ADDRESS", "pb",
    "choice", "grammar", "json_object", "json_schema", "regex", "structural_tag", "CONSTRAINT_KEY_HEADER",
    "constraint_key",
    "DeadlineExceededError", "FieldViolation", "FormworkError", "IncompleteOutputError", "InternalError",
    "InvalidArgumentError", "RequestCancelledError", "ResourceExhaustedError", "StatusError", "UnauthenticatedError",
    "UnavailableError", "is_transient", "ExtractionResult", "Usage",
]
