"""The synchronous client: one gRPC channel to a Formwork server, shared by every call.

Thread-safe: calls from several threads share the channel (gRPC multiplexes them). Every call
takes `timeout` (seconds; default: the client's, None = no deadline); when it passes, the server
aborts the request and the call raises DeadlineExceededError. A failed call raises the
StatusError subclass for its code (formwork_client.errors).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import functools

import grpc

from formwork_client import errors
from formwork_client._gen.formwork.v1 import generation_pb2 as pb
from formwork_client._gen.formwork.v1 import generation_pb2_grpc as pb_grpc
from formwork_client.connection import auth_metadata, call_metadata, open_channel
from formwork_client.constraints import ConstraintLike, to_constraint
from formwork_client.extraction import (DocumentLike, ExtractionJob, ExtractionResult, ProgressCallback, RetryPolicy,
                                        in_input_order, run_on_threads)
from formwork_client.request import (DEFAULT_ADDRESS, Messages, extract_request, extraction_result,
                                     generate_request, tokenize_request)


class Client:
    """A connection to one server. Use it as a context manager, or call close()."""

    def __init__(self, address: str = DEFAULT_ADDRESS, *, timeout: float | None = None,
                 api_key: str | None = None, tls: bool | None = None, root_certificates: bytes | None = None,
                 private_key: bytes | None = None, certificate_chain: bytes | None = None,
                 channel: grpc.Channel | None = None,
                 options: Sequence[tuple[str, Any]] = ()) -> None:
        """`address`: host:port of `formwork serve`. `api_key`: sent with every call as
        `authorization: Bearer KEY` (default: $FORMWORK_API_KEY, if set). TLS when `tls` is true or a
        PEM is given: `root_certificates` (the CA to trust; default the system's), `private_key` and
        `certificate_chain` (the client's certificate, for mutual TLS); plaintext otherwise.
        `channel`: a channel of your own instead (the client then does not close it). `options`:
        gRPC channel options, e.g. ("grpc.max_receive_message_length", 16 << 20)."""
        self._own_channel = channel is None
        self._channel = channel if channel is not None else open_channel(
            address, tls=tls, root_certificates=root_certificates, private_key=private_key,
            certificate_chain=certificate_chain, options=options)
        self._metadata = auth_metadata(api_key)
        self._stub = pb_grpc.GenerationStub(self._channel)
        self.timeout = timeout

    def generate(self, prompt: str | pb.GenerateRequest | None = None, *, timeout: float | None = None,
                 **fields: Any) -> pb.GenerateResponse:
        """The whole answer. Input: `prompt` (raw text), `messages=[{"role", "content"}, ...]` (a
        chat) or `prompt_token_ids=[...]`; `constraint=` a Constraint (formwork_client.json_schema,
        regex, ...) or a JSON Schema dict; any other GenerateRequest field by name (max_tokens,
        temperature, seed, stop, logprobs, ...). See request.generate_request."""
        request = generate_request(prompt, **fields)
        try:
            return self._stub.Generate(request, timeout=self._timeout(timeout),
                                       metadata=call_metadata(self._metadata, request))
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from e

    def stream(self, prompt: str | pb.GenerateRequest | None = None, *, timeout: float | None = None,
               **fields: Any) -> Iterator[pb.GenerateResponse]:
        """The answer as it is produced: each response carries the text and token ids it adds; the
        last one has finish_reason, usage and timings. Leaving the loop early (or closing the
        iterator) cancels the request on the server. Same arguments as generate()."""
        request = generate_request(prompt, **fields)
        return self._responses(self._stub.GenerateStream(
            request, timeout=self._timeout(timeout), metadata=call_metadata(self._metadata, request)))

    @staticmethod
    def _responses(call: Any) -> Iterator[pb.GenerateResponse]:
        try:
            yield from call
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from e
        finally:
            call.cancel()  # no-op once the stream ended; aborts the request if the caller stopped early

    def extract(self, schema: Mapping[str, Any] | str, text: str, instructions: str | None = None, *,
                timeout: float | None = None, **options: Any) -> Any:
        """Schema-constrained extraction in one call: the JSON value in `text` that `schema`
        describes, parsed (a dict for an object schema). `options`: max_tokens, temperature
        (default 0: greedy), strict, whitespace, any_whitespace, jump_forward, close_early, speculative,
        request_id.

        Raises InvalidArgumentError for a schema the server cannot enforce (message and
        field_violations say why), IncompleteOutputError if max_tokens ran out first."""
        response = self.generate(extract_request(schema, text, instructions, **options), timeout=timeout)
        return extraction_result(response)

    def extract_many(self, documents: Iterable[DocumentLike], schema: Mapping[str, Any] | str, *,
                     concurrency: int = 8, instructions: str | None = None,
                     on_progress: ProgressCallback | None = None, ordered: bool = True, max_retries: int = 4,
                     backoff_s: float = 0.5, timeout: float | None = None,
                     **options: Any) -> list[ExtractionResult] | Iterator[ExtractionResult]:
        """extract() over many documents, `concurrency` calls in flight on as many threads.
        `documents`: strings, (id, text) pairs, or mappings with "text" and "id". Each document's
        outcome is an ExtractionResult (index, id, value, text, usage, error, attempts): a document
        that fails has its error in its result, nothing is raised. UNAVAILABLE, and
        RESOURCE_EXHAUSTED from an overloaded server, are retried up to `max_retries` times after
        a random delay below backoff_s * 2**retry (extraction.RetryPolicy). `timeout`: each call's.
        `on_progress(done, total, failed)`: called in this thread as each document finishes.
        `options`: as extract()'s, the same for every document.

        ordered=True: the list of results in input order, once all are done. ordered=False: an
        iterator of the results as they complete (the calls start at the first next(); closing it
        early sends no more). Raises TypeError / ValueError for bad arguments before sending anything."""
        job = ExtractionJob(documents, schema, instructions=instructions, concurrency=concurrency,
                            retry=RetryPolicy(max_retries, backoff_s), on_progress=on_progress, options=options)
        results = run_on_threads(job, functools.partial(self.generate, timeout=timeout))
        return in_input_order(job, results) if ordered else results

    def validate_constraint(self, constraint: ConstraintLike, *,
                            timeout: float | None = None) -> pb.ValidateConstraintResponse:
        """Compile a constraint without generating: `ok`, or `error` with the compiler's message
        (a bad constraint is this call's answer, not an exception). A dict is a JSON Schema."""
        request = pb.ValidateConstraintRequest(constraint=to_constraint(constraint))
        try:
            return self._stub.ValidateConstraint(request, timeout=self._timeout(timeout),
                                                 metadata=call_metadata(self._metadata, request))
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from e

    def model_info(self, *, timeout: float | None = None) -> pb.ModelInfo:
        """The model, the server's limits, and its live load."""
        try:
            return self._stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=self._timeout(timeout),
                                         metadata=self._metadata)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from e

    def tokenize(self, prompt: str | None = None, *, messages: Messages | None = None,
                 add_generation_prompt: bool | None = None, timeout: float | None = None,
                 **fields: Any) -> pb.TokenizeResponse:
        """The prompt token ids generate() would use for the same input (`tools=`, `reasoning=`
        as generate() takes them)."""
        request = tokenize_request(prompt, messages=messages, add_generation_prompt=add_generation_prompt, **fields)
        try:
            return self._stub.Tokenize(request, timeout=self._timeout(timeout), metadata=self._metadata)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from e

    def close(self) -> None:
        if self._own_channel:
            self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _timeout(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout
