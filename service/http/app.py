"""The OpenAI-compatible HTTP API: a FastAPI app over the gRPC server's AsyncLLM.

    GET  /health               200 while the engine serves, else 503 (open, like gRPC health)
    GET  /metrics              Prometheus metrics (service/observability/metrics.py; open, like /health; 404 with --no-metrics)
    GET  /v1/models            the served model
    POST /v1/chat/completions  chat, whole or streamed as server-sent events
    POST /v1/completions       text completion, whole or streamed
    POST /v1/responses         OpenAI's Responses API, whole or streamed as its events (nothing stored)

The same SecurityConfig as gRPC: `Authorization: Bearer KEY` on /v1/* when keys are set, and
the per-key limit on concurrent generation calls (shared with gRPC). Requests are mapped onto the
service's wire-neutral GenerationRequest (service/http/conversion.py) and validated by the code
gRPC's go through, so a bad field gets the same message on both.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import msgspec
import pydantic
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException

from engine.protocol import FinishReason
from service.errors import ErrorCode, ServiceError, error_from_output, overloaded
from service.http import responses
from service.http.completion_stream import CompletionCall, completion_events
from service.http.conversion import Translated, translate_chat, translate_completion
from service.http.errors import HttpError, bad_request, http_error, not_found, too_large
from service.http.protocol import ChatCompletionRequest, CompletionRequest, field_path
from service.http.response_object import ResponseEvents, ResponseHeader, whole_response
from service.http.response_request import ResponsesRequest, translate_response_request
from service.http.streaming import encode_json, merged, releasing, unless_disconnected
from service.observability.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from service.security import ApiKeys, KeyLimiter, SecurityConfig

if TYPE_CHECKING:
    from engine.frontend.output_processor import RequestOutput
    from engine.protocol import EngineCoreReady
    from service.async_llm import AsyncLLM, PreparedRequest
    from service.limits import ServiceLimits

logger = logging.getLogger(__name__)


class _Refused(Exception):
    """An HTTP error answer, raised from anywhere in a handler."""

    def __init__(self, error: HttpError) -> None:
        super().__init__(error.message)
        self.error = error


class OpenAIApi:
    """The routes; `is_ready` says whether the engine is loaded, warm and alive."""

    def __init__(self, llm: AsyncLLM, limits: ServiceLimits, security: SecurityConfig, limiter: KeyLimiter,
                 is_ready: Callable[[], bool]) -> None:
        self._llm = llm
        self._limits = limits
        self._keys = ApiKeys(security.api_keys)
        self._limiter = limiter
        self._is_ready = is_ready
        self._ids = itertools.count(1)
        self._created = int(time.time())
        self.app = FastAPI(title="Formwork OpenAI-compatible API", docs_url=None, redoc_url=None, openapi_url=None)
        self.app.add_exception_handler(HTTPException, self._route_error)
        self.app.add_exception_handler(_Refused, lambda request, e: self._refuse(request, e.error))
        self.app.add_exception_handler(ServiceError, lambda request, e: self._refuse(request, http_error(e)))
        self.app.add_api_route("/health", self.health, methods=["GET"])
        self.app.add_api_route("/metrics", self.metrics, methods=["GET"])
        self.app.add_api_route("/v1/models", self.models, methods=["GET"])
        self.app.add_api_route("/v1/chat/completions", self.chat_completions, methods=["POST"])
        self.app.add_api_route("/v1/completions", self.completions, methods=["POST"])
        self.app.add_api_route("/v1/responses", self.responses, methods=["POST"])

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
        info = self._available_info()
        return _json(200, {"object": "list", "data": [{
            "id": info.model_name, "object": "model", "created": self._created, "owned_by": "formwork",
            "max_model_len": info.max_model_len}]})

    async def chat_completions(self, request: Request) -> Response:
        key = self._authorize(request)
        body = await self._parse(request, ChatCompletionRequest)
        translated = translate_chat(body)  # a bad field fails before anything runs
        return await self._limited(key, lambda: self._generate(request, body.model, translated, chat=True,
                                                               logprobs=body.logprobs))

    async def completions(self, request: Request) -> Response:
        key = self._authorize(request)
        body = await self._parse(request, CompletionRequest)
        translated = translate_completion(body)
        return await self._limited(key, lambda: self._generate(request, body.model, translated, chat=False,
                                                               logprobs=body.logprobs is not None))

    async def responses(self, request: Request) -> Response:
        key = self._authorize(request)
        body = await self._parse(request, ResponsesRequest)
        translated = translate_response_request(body)
        return await self._limited(key, lambda: self._respond(request, body, translated))

    def _refuse(self, request: Request, error: HttpError) -> Response:
        """The error answer; a refused generation call is counted by its error kind, as gRPC's are."""
        if request.url.path in _GENERATION_PATHS:
            self._llm.telemetry.request_rejected("http", _error_kind(error))
        return _answer(error)

    # ---- access and parsing -------------------------------------------------------------------

    def _authorize(self, request: Request) -> int | None:
        """The caller's key index (None without keys); 401 for a missing or wrong key."""
        if not self._keys:
            return None
        key = self._keys.identify(request.headers.get("authorization"))
        if key is None:
            raise _Refused(HttpError(401, "missing or invalid API key: send the header 'Authorization: Bearer <key>'",
                                     "authentication_error", None, "invalid_api_key"))
        return key

    async def _limited(self, key: int | None, generate: Callable[[], Any]) -> Response:
        """Run a generation call within the key's concurrency limit (streams release it when they end)."""
        if key is None or not self._limiter.limit:
            return await generate()
        if not self._limiter.try_acquire(key):
            raise _Refused(http_error(overloaded(f"this API key already has {self._limiter.limit} requests in "
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

    async def _parse(self, request: Request, model: type[pydantic.BaseModel]) -> Any:
        limit = self._limits.max_message_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _Refused(too_large(f"the request body is {declared} bytes; this server's max_message_bytes is {limit}"))
        raw = await request.body()
        if len(raw) > limit:
            raise _Refused(too_large(f"the request body is {len(raw)} bytes; this server's max_message_bytes is {limit}"))
        try:
            return model.model_validate_json(raw)
        except pydantic.ValidationError as e:
            first = e.errors()[0]
            path = field_path(first["loc"])
            if first["type"] == "json_invalid":
                raise _Refused(bad_request(f"the request body is not valid JSON: {first['msg']}")) from None
            raise _Refused(bad_request(f"{path or 'body'}: {first['msg']}", path or None)) from None

    def _available_info(self) -> EngineCoreReady:
        try:
            self._llm.check_available()
        except ServiceError as e:
            raise _Refused(http_error(e)) from None
        assert self._llm.info is not None
        return self._llm.info

    # ---- generation ---------------------------------------------------------------------------

    async def _generate(self, request: Request, model: str | None, translated: Translated, chat: bool,
                        logprobs: bool) -> Response:
        call = CompletionCall(translated, chat, logprobs, self._served_model(model),
                     f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(12)}", int(time.time()))
        try:
            prepared, outputs = await self._start(translated, call.response_id)
            call = dataclasses.replace(call, shape=prepared.shape,
                                       num_prompt_tokens=sum(len(p.token_ids) for p in prepared.prompts))
            num_outputs = len(prepared.prompts) * translated.num_choices
            if translated.stream:
                first = await self._first(outputs, translated)
                return StreamingResponse(completion_events(call, first, outputs, num_outputs, self._llm.token_text),
                                         media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
            finals = await unless_disconnected(request, self._collect(outputs, num_outputs, translated))
            if finals is None:  # nobody is left to answer; closing the outputs aborted the requests
                logger.info("%s: the client disconnected before the answer; its requests were aborted",
                            call.response_id)
                return Response(status_code=499)
        except ServiceError as e:
            error, param = translated.field_names.rename(e)
            raise _Refused(http_error(error, param)) from None
        done = [f for f in finals if f is not None]
        if call.chat:
            body = responses.chat_completion(call.response_id, call.created, call.model, done, self._llm.token_text,
                                             call.logprobs, call.shape)
        else:
            body = responses.completion(call.response_id, call.created, call.model, done, translated.num_choices,
                                        self._llm.token_text, call.logprobs)
        return _json(200, body)

    def _served_model(self, model: str | None) -> str:
        """The served model's name, if `model` names it or is unset; else 404."""
        info = self._available_info()
        if model not in (None, info.model_name):
            raise _Refused(not_found(f"the model '{model}' does not exist; this server serves '{info.model_name}'",
                                     "model_not_found"))
        return info.model_name

    async def _start(self, translated: Translated, response_id: str
                     ) -> tuple[PreparedRequest, AsyncIterator[tuple[int, RequestOutput]]]:
        """Check and tokenize the request, and start its generations: n choices of each prompt,
        merged into one stream of (index, output). Raises ServiceError naming the field."""
        prepared = await self._llm.prepare(translated.request)
        params = prepared.params
        arrival_time = time.monotonic()
        number = next(self._ids)
        generations = []
        for prompt_index, prompt in enumerate(prepared.prompts):
            for choice in range(translated.num_choices):
                choice_params = params
                if params.seed is not None and choice:  # the same seed would give n equal choices
                    choice_params = msgspec.structs.replace(params, seed=params.seed + choice)
                index = prompt_index * translated.num_choices + choice
                generations.append(self._llm.generate(
                    prompt.token_ids, choice_params, request_id=f"{response_id}#{number}.{index}",
                    priority=translated.request.priority, arrival_time=arrival_time, stream=translated.stream,
                    prompt_field=prompt.field))
        return prepared, merged(generations)

    async def _first(self, outputs: AsyncIterator[tuple[int, RequestOutput]], translated: Translated
                     ) -> tuple[int, RequestOutput]:
        """A stream's first output, before the 200: a constraint that fails to compile is a 400."""
        try:
            first = await anext(outputs)
            self._raise_if_error(first[1], translated)
        except BaseException:
            await outputs.aclose()
            raise
        return first

    async def _respond(self, request: Request, body: ResponsesRequest, translated: Translated) -> Response:
        """A Responses API call: one output, answered as a response object or its events."""
        model = self._served_model(body.model)
        tokenizer = self._llm.tokenizer
        assert tokenizer is not None  # the engine is available (_served_model): its tokenizer is loaded
        response_id = f"resp_{secrets.token_hex(12)}"
        try:
            prepared, outputs = await self._start(translated, response_id)
            header = ResponseHeader(response_id, int(time.time()), model, body, prepared.shape,
                                    lambda text: len(tokenizer.encode(text, False)))
            if translated.stream:
                first = await self._first(outputs, translated)
                return StreamingResponse(self._response_events(header, first, outputs, translated),
                                         media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
            finals = await unless_disconnected(request, self._collect(outputs, 1, translated))
        except ServiceError as e:
            error, param = translated.field_names.rename(e)
            raise _Refused(http_error(error, param)) from None
        if finals is None or finals[0] is None:
            logger.info("%s: the client disconnected before the answer; its request was aborted", response_id)
            return Response(status_code=499)
        return _json(200, whole_response(header, finals[0]))

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

    async def _collect(self, outputs: AsyncIterator[tuple[int, RequestOutput]], num_outputs: int,
                       translated: Translated) -> list[RequestOutput | None]:
        finals: list[RequestOutput | None] = [None] * num_outputs
        async with contextlib.aclosing(outputs):  # type: ignore[type-var]
            async for index, output in outputs:
                self._raise_if_error(output, translated)
                finals[index] = output
        return finals

    @staticmethod
    def _raise_if_error(output: RequestOutput, translated: Translated) -> None:
        if output.finish_reason == FinishReason.ERROR:
            logger.info("request %s failed: %s", output.request_id, output.error)
            raise error_from_output(output, translated.request.constraint_field)

    async def _route_error(self, request: Request, error: HTTPException) -> Response:
        if error.status_code == 404:
            return _answer(not_found(f"no route {request.method} {request.url.path}"))
        return _answer(HttpError(error.status_code, str(error.detail), "invalid_request_error"))


_GENERATION_PATHS = frozenset(("/v1/chat/completions", "/v1/completions", "/v1/responses"))


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

