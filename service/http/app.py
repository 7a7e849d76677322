"""The OpenAI-compatible HTTP API: a FastAPI app over the gRPC server's AsyncLLM.

    GET  /health               200 while the engine serves, else 503 (open, like gRPC health)
    GET  /metrics              Prometheus metrics (service/observability/metrics.py; open, like /health; 404 with --no-metrics)
    GET  /v1/models            the served model
    POST /v1/chat/completions  chat, whole or streamed as server-sent events
    POST /v1/completions       text completion, whole or streamed
    POST /v1/responses         OpenAI's Responses API, whole or streamed as its events (nothing stored)
    /v1/files, /v1/batches     OpenAI's Files and Batches APIs, with a data directory (service/http/batch_api.py)

The same SecurityConfig as gRPC: `Authorization: Bearer KEY` on /v1/* when keys are set, and
the per-key limit on concurrent generation calls (shared with gRPC). Requests are mapped onto the
service's wire-neutral GenerationRequest (service/http/conversion.py) and validated by the code
gRPC's go through, so a bad field gets the same message on both.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException

from engine.protocol import FinishReason
from service.errors import ErrorCode, ServiceError, error_from_output, overloaded
from service.http.answerer import (CHAT_COMPLETIONS, COMPLETIONS, GENERATION_PATHS, RESPONSES, Answerer, Call,
                                   Outputs, Refused, raise_if_error)
from service.http.batch_api import BatchApi
from service.http.completion_stream import CompletionCall, completion_events
from service.http.conversion import Translated
from service.http.errors import HttpError, http_error, not_found, too_large
from service.http.response_object import ResponseEvents, ResponseHeader
from service.http.response_request import ResponsesRequest
from service.http.streaming import encode_json, releasing, unless_disconnected
from service.observability.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from service.security import ApiKeys, KeyLimiter, SecurityConfig

if TYPE_CHECKING:
    from engine.frontend.output_processor import RequestOutput
    from service.async_llm import AsyncLLM
    from service.batch.api_config import BatchApiConfig
    from service.limits import ServiceLimits

logger = logging.getLogger(__name__)


class OpenAIApi:
    """The routes; `is_ready` says whether the engine is loaded, warm and alive. With `batch_config`,
    the Files and Batches APIs too (`batch_api`, whose worker the server starts and stops)."""

    def __init__(self, llm: AsyncLLM, limits: ServiceLimits, security: SecurityConfig, limiter: KeyLimiter,
                 is_ready: Callable[[], bool], batch_config: BatchApiConfig | None = None) -> None:
        self._llm = llm
        self._limits = limits
        self._keys = ApiKeys(security.api_keys)
        self._limiter = limiter
        self._is_ready = is_ready
        self._answerer = Answerer(llm, limits.max_message_bytes)
        self._created = int(time.time())
        self.app = FastAPI(title="Formwork OpenAI-compatible API", docs_url=None, redoc_url=None, openapi_url=None)
        self.app.add_exception_handler(HTTPException, self._route_error)
        self.app.add_exception_handler(Refused, lambda request, e: self._refuse(request, e.error))
        self.app.add_exception_handler(ServiceError, lambda request, e: self._refuse(request, http_error(e)))
        self.app.add_api_route("/health", self.health, methods=["GET"])
        self.app.add_api_route("/metrics", self.metrics, methods=["GET"])
        self.app.add_api_route("/v1/models", self.models, methods=["GET"])
        self.app.add_api_route("/v1/chat/completions", self.chat_completions, methods=["POST"])
        self.app.add_api_route("/v1/completions", self.completions, methods=["POST"])
        self.app.add_api_route("/v1/responses", self.responses, methods=["POST"])
        self.batch_api: BatchApi | None = None
        if batch_config is not None:
            self.batch_api = BatchApi(self._answerer, batch_config, self._authorize, is_ready)
            self.batch_api.register(self.app)

    # ---- routes -------------------------------------------------------------------------------

    async def health(self) -> Response:
        if self._is_ready():
            return _json(200, {"status": "ok"})
        try:
            self._llm.check_available()
            message = "the model is warming up"
        except ServiceError as e:
            message = e.message
        return _answer(http_error(ServiceError(ErrorCode.UNAVAILABLE, message)))

    async def metrics(self) -> Response:
        metrics = self._llm.telemetry.metrics
        if metrics is None:
            return _answer(not_found("metrics are off on this server (formwork serve --no-metrics)"))
        try:
            stats = await self._llm.get_stats()  # the gauges, fresh; with the steps not yet reported
        except ServiceError:
            stats = None  # the engine is down: counters and histograms still answer
        return Response(metrics.render(stats, self._llm.num_in_flight), media_type=METRICS_CONTENT_TYPE)

    async def models(self, request: Request) -> Response:
        self._authorize(request)
        info = self._answerer.engine_info()
        return _json(200, {"object": "list", "data": [{
            "id": info.model_name, "object": "model", "created": self._created, "owned_by": "formwork",
            "max_model_len": info.max_model_len}]})

    async def chat_completions(self, request: Request) -> Response:
        return await self._generation(request, CHAT_COMPLETIONS)

    async def completions(self, request: Request) -> Response:
        return await self._generation(request, COMPLETIONS)

    async def responses(self, request: Request) -> Response:
        return await self._generation(request, RESPONSES)

    def _refuse(self, request: Request, error: HttpError) -> Response:
        """The error answer; a refused generation call is counted by its error kind, as gRPC's are."""
        if request.url.path in GENERATION_PATHS:
            self._llm.telemetry.request_rejected("http", _error_kind(error))
        return _answer(error)

    # ---- access and parsing -------------------------------------------------------------------

    def _authorize(self, request: Request) -> int | None:
        """The caller's key index (None without keys); 401 for a missing or wrong key."""
        if not self._keys:
            return None
        key = self._keys.identify(request.headers.get("authorization"))
        if key is None:
            raise Refused(HttpError(401, "missing or invalid API key: send the header 'Authorization: Bearer <key>'",
                                     "authentication_error", None, "invalid_api_key"))
        return key

    async def _limited(self, key: int | None, generate: Callable[[], Any]) -> Response:
        """Run a generation call within the key's concurrency limit (streams release it when they end)."""
        if key is None or not self._limiter.limit:
            return await generate()
        if not self._limiter.try_acquire(key):
            raise Refused(http_error(overloaded(f"this API key already has {self._limiter.limit} requests in "
                                                f"flight, the server's limit per key (--max-concurrent-per-key)")))
        try:
            response = await generate()
        except BaseException:
            self._limiter.release(key)
            raise
        if isinstance(response, StreamingResponse):  # held until the stream ends
            response.body_iterator = releasing(response.body_iterator, lambda: self._limiter.release(key))
        else:
            self._limiter.release(key)
        return response

    async def _body(self, request: Request) -> bytes:
        """The request's body; 413 from its declared length, before reading it, when it is too large."""
        limit = self._limits.max_message_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise Refused(too_large(f"the request body is {declared} bytes; this server's max_message_bytes is {limit}"))
        return await request.body()

    # ---- generation ---------------------------------------------------------------------------

    async def _generation(self, request: Request, path: str) -> Response:
        key = self._authorize(request)
        call = self._answerer.read(path, await self._body(request))  # a bad field fails before anything runs
        return await self._limited(key, lambda: self._generate(request, call))

    async def _generate(self, request: Request, call: Call) -> Response:
        if not call.stream:
            answer = await unless_disconnected(request, self._answerer.run(call))
            if answer is None:  # nobody is left to answer; closing the outputs aborted the requests
                logger.info("%s: the client disconnected before the answer; its requests were aborted", call.path)
                return Response(status_code=499)
            return _json(answer.status_code, answer.body)
        if call.path == RESPONSES:
            return await self._stream_response(call)
        return await self._stream_completion(call)

    async def _stream_completion(self, call: Call) -> Response:
        translated = call.translated
        chat = call.path == CHAT_COMPLETIONS
        logprobs = bool(call.body.logprobs) if chat else call.body.logprobs is not None
        completion = CompletionCall(translated, chat, logprobs, self._answerer.served_model(call.body.model),
                                    f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(12)}", int(time.time()))
        try:
            prepared, outputs = await self._answerer.start(translated, completion.response_id, stream=True)
            completion = dataclasses.replace(completion, shape=prepared.shape,
                                             num_prompt_tokens=sum(len(p.token_ids) for p in prepared.prompts))
            first = await self._first(outputs, translated)
        except ServiceError as e:
            raise Refused(http_error(*translated.field_names.rename(e))) from None
        num_outputs = len(prepared.prompts) * translated.num_choices
        return StreamingResponse(completion_events(completion, first, outputs, num_outputs, self._llm.token_text),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def _stream_response(self, call: Call) -> Response:
        """A Responses API call streamed as its events."""
        body = call.body
        assert isinstance(body, ResponsesRequest)
        model = self._answerer.served_model(body.model)
        tokenizer = self._llm.tokenizer
        assert tokenizer is not None  # the engine is available (served_model): its tokenizer is loaded
        response_id = f"resp_{secrets.token_hex(12)}"
        try:
            prepared, outputs = await self._answerer.start(call.translated, response_id, stream=True)
            first = await self._first(outputs, call.translated)
        except ServiceError as e:
            raise Refused(http_error(*call.translated.field_names.rename(e))) from None
        header = ResponseHeader(response_id, int(time.time()), model, body, prepared.shape,
                                lambda text: len(tokenizer.encode(text, False)))
        return StreamingResponse(self._response_events(header, first, outputs, call.translated),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @staticmethod
    async def _first(outputs: Outputs, translated: Translated) -> tuple[int, RequestOutput]:
        """A stream's first output, before the 200: a constraint that fails to compile is a 400."""
        try:
            first = await anext(outputs)
            raise_if_error(first[1], translated)
        except BaseException:
            await outputs.aclose()
            raise
        return first

    async def _response_events(self, header: ResponseHeader, first: tuple[int, RequestOutput],
                               outputs: AsyncIterator[tuple[int, RequestOutput]], translated: Translated
                               ) -> AsyncIterator[bytes]:
        events = ResponseEvents(header)
        async with contextlib.aclosing(outputs):  # type: ignore[type-var]
            yield events.start()
            output = first[1]
            while True:
                if output.finish_reason == FinishReason.ERROR:
                    error = error_from_output(output, translated.request.constraint_field)
                    yield events.error(http_error(*translated.field_names.rename(error)).body())
                    return
                yield events.step(output)
                try:
                    output = (await anext(outputs))[1]
                except StopAsyncIteration:
                    return
                except ServiceError as e:  # the engine died mid-stream
                    yield events.error(http_error(e).body())
                    return

    async def _route_error(self, request: Request, error: HTTPException) -> Response:
        if error.status_code == 404:
            return _answer(not_found(f"no route {request.method} {request.url.path}"))
        return _answer(HttpError(error.status_code, str(error.detail), "invalid_request_error"))


def _error_kind(error: HttpError) -> str:
    """The ErrorCode name of an HTTP error answer (the HTTP-only ones by their HTTP status)."""
    name = (error.code or "").upper()
    if name in ErrorCode.__members__:
        return name
    return {401: "UNAUTHENTICATED", 404: "NOT_FOUND"}.get(error.status, "INVALID_ARGUMENT")


def _answer(error: HttpError) -> Response:
    return Response(encode_json(error.body()), status_code=error.status, media_type="application/json",
                    headers=error.headers())


def _json(status: int, body: dict[str, Any]) -> Response:
    return Response(encode_json(body), status_code=status, media_type="application/json")

