"""The asyncio client: the same calls as Client, awaited, over a grpc.aio channel.

Create it inside the running event loop (the channel belongs to that loop). Cancelling the task
that awaits a call cancels the request on the server and raises asyncio.CancelledError as usual.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Coroutine, Iterable, Mapping, Sequence
from typing import Any

import functools

import grpc
import grpc.aio

from formwork_client import errors
from formwork_client._gen.formwork.v1 import generation_pb2 as pb
from formwork_client._gen.formwork.v1 import generation_pb2_grpc as pb_grpc
from formwork_client.connection import auth_metadata, call_metadata, open_channel
from formwork_client.constraints import ConstraintLike, to_constraint
from formwork_client.extraction import (DocumentLike, ExtractionJob, ExtractionResult, ProgressCallback, RetryPolicy,
                                        in_input_order_async, run_on_tasks)
from formwork_client.request import (DEFAULT_ADDRESS, Messages, extract_request, extraction_result,
                                     generate_request, tokenize_request)


class AsyncClient:
    """A connection to one server. Use it with `async with`, or await close()."""

    def __init__(self, address: str = DEFAULT_ADDRESS, *, timeout: float | None = None,
                 api_key: str | None = None, tls: bool | None = None, root_certificates: bytes | None = None,
                 private_key: bytes | None = None, certificate_chain: bytes | None = None,
                 channel: grpc.aio.Channel | None = None, options: Sequence[tuple[str, Any]] = ()) -> None:
        """As Client (API key, TLS); `channel` is a grpc.aio channel of your own (then not closed by the client)."""
        self._own_channel = channel is None
        self._channel = channel if channel is not None else open_channel(
            address, tls=tls, root_certificates=root_certificates, private_key=private_key,
            certificate_chain=certificate_chain, options=options, asyncio=True)
        self._metadata = auth_metadata(api_key)
        self._stub = pb_grpc.GenerationStub(self._channel)
        self.timeout = timeout

    async def generate(self, prompt: str | pb.GenerateRequest | None = None, *, timeout: float | None = None,
                       **fields: Any) -> pb.GenerateResponse:
        """The whole answer; arguments as Client.generate."""
        request = generate_request(prompt, **fields)
        try:
            return await self._stub.Generate(request, timeout=self._timeout(timeout),
                                             metadata=call_metadata(self._metadata, request))
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from e

    def stream(self, prompt: str | pb.GenerateRequest | None = None, *, timeout: float | None = None,
               **fields: Any) -> AsyncIterator[pb.GenerateResponse]:
        """The answer as it is produced (`async for`); leaving the loop early, or closing the
        iterator (aclose), cancels the request on the server. Arguments as Client.generate."""
        request = generate_request(prompt, **fields)
        return self._responses(self._stub.GenerateStream(
            request, timeout=self._timeout(timeout), metadata=call_metadata(self._metadata, request)))

    @staticmethod
    async def _responses(call: Any) -> AsyncIterator[pb.GenerateResponse]:
        try:
            async for response in call:
                yield response
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from e
        finally:
            call.cancel()  # no-op once the stream ended; aborts the request if the caller stopped early

    async def extract(self, schema: Mapping[str, Any] | str, text: str, instructions: str | None = None, *,
                      timeout: float | None = None, **options: Any) -> Any:
        """The parsed JSON value in `text` that `schema` describes; as Client.extract."""
        response = await self.generate(extract_request(schema, text, instructions, **options), timeout=timeout)
        return extraction_result(response)

    def extract_many(self, documents: Iterable[DocumentLike], schema: Mapping[str, Any] | str, *,
                     concurrency: int = 8, instructions: str | None = None,
                     on_progress: ProgressCallback | None = None, ordered: bool = True, max_retries: int = 4,
                     backoff_s: float = 0.5, timeout: float | None = None, **options: Any
                     ) -> Coroutine[Any, Any, list[ExtractionResult]] | AsyncIterator[ExtractionResult]:
        """Client.extract_many on asyncio tasks: `await client.extract_many(...)` is the list of
        results in input order; with ordered=False, `async for result in client.extract_many(...)`
        has them as they complete (aclose() it, or use contextlib.aclosing, to stop early: that
        cancels the calls in flight). on_progress is called in the event loop."""
        job = ExtractionJob(documents, schema, instructions=instructions, concurrency=concurrency,
                            retry=RetryPolicy(max_retries, backoff_s), on_progress=on_progress, options=options)
        results = run_on_tasks(job, functools.partial(self.generate, timeout=timeout))
        return in_input_order_async(job, results) if ordered else results

    async def validate_constraint(self, constraint: ConstraintLike, *,
                                  timeout: float | None = None) -> pb.ValidateConstraintResponse:
        request = pb.ValidateConstraintRequest(constraint=to_constraint(constraint))
        try:
            return await self._stub.ValidateConstraint(request, timeout=self._timeout(timeout),
                                                       metadata=call_metadata(self._metadata, request))
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from e

    async def model_info(self, *, timeout: float | None = None) -> pb.ModelInfo:
        try:
            return await self._stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=self._timeout(timeout),
                                              metadata=self._metadata)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from e

    async def tokenize(self, prompt: str | None = None, *, messages: Messages | None = None,
                       add_generation_prompt: bool | None = None, timeout: float | None = None,
                       **fields: Any) -> pb.TokenizeResponse:
        request = tokenize_request(prompt, messages=messages, add_generation_prompt=add_generation_prompt, **fields)
        try:
            return await self._stub.Tokenize(request, timeout=self._timeout(timeout), metadata=self._metadata)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from e

    async def close(self) -> None:
        if self._own_channel:
            await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _timeout(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout
