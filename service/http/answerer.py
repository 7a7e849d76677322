"""One OpenAI request body answered whole: what the HTTP server answers a non-streamed POST to
/v1/chat/completions, /v1/completions or /v1/responses, without the HTTP around it.

The HTTP routes and the batch runner both answer through an `Answerer`, so a body gets the same
validation, the same error (status and `{"error": ...}` body) and the same response object
whichever way it came. Streaming stays with the routes (service/http/app.py), which use the same
parsing (`read`) and the same start of the generations (`start`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import msgspec
import pydantic

from engine.protocol import FinishReason
from service.errors import ServiceError, error_from_output
from service.http import responses
from service.http.conversion import Translated, translate_chat, translate_completion
from service.http.errors import HttpError, bad_request, http_error, not_found, too_large
from service.http.protocol import ChatCompletionRequest, CompletionRequest, field_path
from service.http.response_object import ResponseHeader, whole_response
from service.http.response_request import ResponsesRequest, translate_response_request
from service.http.streaming import merged

if TYPE_CHECKING:
    from engine.frontend.output_processor import RequestOutput
    from engine.protocol import EngineCoreReady
    from service.async_llm import AsyncLLM, PreparedRequest

logger = logging.getLogger(__name__)

CHAT_COMPLETIONS = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
GENERATION_PATHS = (CHAT_COMPLETIONS, COMPLETIONS, RESPONSES)  # the paths an Answerer answers

_json_encoder = msgspec.json.Encoder()

Body = ChatCompletionRequest | CompletionRequest | ResponsesRequest
BodyModel = TypeVar("BodyModel", bound=pydantic.BaseModel)
Outputs = AsyncIterator[tuple[int, "RequestOutput"]]  # (output index, output), merged over n choices and prompts


class Refused(Exception):
    """An error answer (status and OpenAI error body), raised from anywhere while answering."""

    def __init__(self, error: HttpError) -> None:
        super().__init__(error.message)
        self.error = error


class Answer(NamedTuple):
    """What the HTTP server would send back: its status and its JSON body."""

    status_code: int
    body: dict[str, Any]


@dataclass(frozen=True)
class Call:
    """A body read and translated, not started: `stream` says whether it asks to be streamed."""

    path: str
    body: Body
    translated: Translated

    @property
    def stream(self) -> bool:
        return self.translated.stream


class Answerer:
    """Answers OpenAI request bodies over one AsyncLLM; bodies over `max_message_bytes` are refused
    with 413, as the HTTP server refuses them."""

    def __init__(self, llm: AsyncLLM, max_message_bytes: int) -> None:
        self._llm = llm
        self._max_message_bytes = max_message_bytes
        self._ids = itertools.count(1)

    async def answer(self, path: str, body: bytes | str | dict[str, Any], *, priority: int | None = None) -> Answer:
        """`body` (JSON bytes or text, or the parsed dict) answered whole, as a POST to `path`
        is: 200 and the response object, or the error status and body. `priority` (lower is
        served first) replaces the body's own `formwork.priority` when given. A body asking for
        `stream: true` is refused (400): this answers whole responses only. Never raises for
        anything the body or the engine did; cancelling the call aborts its generations."""
        try:
            call = self.read(path, body, priority=priority)
            if call.stream:
                raise Refused(bad_request("stream: true is not supported here: the answer is sent whole, "
                                          "never streamed", "stream"))
            return await self.run(call)
        except Refused as e:
            return Answer(e.error.status, e.error.body())

    def read(self, path: str, body: bytes | str | dict[str, Any], *, priority: int | None = None) -> Call:
        """`read_call` with this answerer's size limit."""
        return read_call(path, body, self._max_message_bytes, priority=priority)

    async def run(self, call: Call) -> Answer:
        """A read call answered whole (its `stream` is ignored); Refused when it fails."""
        if call.path == RESPONSES:
            return await self._respond(call)
        chat = call.path == CHAT_COMPLETIONS
        body = call.body
        translated = call.translated
        model = self.served_model(body.model)
        response_id = f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(12)}"
        created = int(time.time())
        try:
            prepared, outputs = await self.start(translated, response_id, stream=False)
            num_outputs = len(prepared.prompts) * translated.num_choices
            finals = await self._collect(outputs, num_outputs, translated)
        except ServiceError as e:
            raise Refused(http_error(*translated.field_names.rename(e))) from None
        done = [f for f in finals if f is not None]
        if isinstance(body, ChatCompletionRequest):
            return Answer(200, responses.chat_completion(response_id, created, model, done, self._llm.token_text,
                                                         body.logprobs, prepared.shape))
        assert isinstance(body, CompletionRequest)
        return Answer(200, responses.completion(response_id, created, model, done, translated.num_choices,
                                                self._llm.token_text, body.logprobs is not None))

    async def _respond(self, call: Call) -> Answer:
        body = call.body
        assert isinstance(body, ResponsesRequest)
        model = self.served_model(body.model)
        tokenizer = self._llm.tokenizer
        assert tokenizer is not None  # the engine is available (served_model): its tokenizer is loaded
        response_id = f"resp_{secrets.token_hex(12)}"
        try:
            prepared, outputs = await self.start(call.translated, response_id, stream=False)
            finals = await self._collect(outputs, 1, call.translated)
        except ServiceError as e:
            raise Refused(http_error(*call.translated.field_names.rename(e))) from None
        header = ResponseHeader(response_id, int(time.time()), model, body, prepared.shape,
                                lambda text: len(tokenizer.encode(text, False)))
        final = finals[0]
        assert final is not None  # a generation that ended without error has a final output
        return Answer(200, whole_response(header, final))

    def served_model(self, model: str | None) -> str:
        """The served model's name, if `model` names it or is unset; Refused: 404 for another
        model, 503 while the engine is unavailable."""
        info = self.engine_info()
        if model not in (None, info.model_name):
            raise Refused(not_found(f"the model '{model}' does not exist; this server serves '{info.model_name}'",
                                    "model_not_found"))
        return info.model_name

    def engine_info(self) -> EngineCoreReady:
        """The loaded engine's description; Refused (503) while it is unavailable."""
        try:
            self._llm.check_available()
        except ServiceError as e:
            raise Refused(http_error(e)) from None
        assert self._llm.info is not None
        return self._llm.info

    async def start(self, translated: Translated, response_id: str, *, stream: bool
                    ) -> tuple[PreparedRequest, Outputs]:
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
                    priority=translated.request.priority, arrival_time=arrival_time, stream=stream,
                    prompt_field=prompt.field))
        return prepared, merged(generations)

    @staticmethod
    async def _collect(outputs: Outputs, num_outputs: int, translated: Translated) -> list[RequestOutput | None]:
        finals: list[RequestOutput | None] = [None] * num_outputs
        async with contextlib.aclosing(outputs):  # type: ignore[type-var]
            async for index, output in outputs:
                raise_if_error(output, translated)
                finals[index] = output
        return finals


def read_call(path: str, body: bytes | str | dict[str, Any], max_message_bytes: int, *,
              priority: int | None = None) -> Call:
    """The body parsed and translated; Refused (404 for an unknown path, 413 over
    `max_message_bytes`, 400 naming the field) when the HTTP server would refuse it before
    anything runs. `priority` replaces the body's `formwork.priority` when given."""
    if isinstance(body, dict):
        body = _json_encoder.encode(body)
    raw = body.encode() if isinstance(body, str) else body
    if len(raw) > max_message_bytes:
        raise Refused(too_large(f"the request body is {len(raw)} bytes; this server's max_message_bytes "
                                f"is {max_message_bytes}"))
    if path == CHAT_COMPLETIONS:
        chat = parsed_body(ChatCompletionRequest, raw)
        call = Call(path, chat, _translated(lambda: translate_chat(chat)))
    elif path == COMPLETIONS:
        completion = parsed_body(CompletionRequest, raw)
        call = Call(path, completion, _translated(lambda: translate_completion(completion)))
    elif path == RESPONSES:
        response = parsed_body(ResponsesRequest, raw)
        call = Call(path, response, _translated(lambda: translate_response_request(response)))
    else:
        raise Refused(not_found(f"no route POST {path}"))
    if priority is not None:
        request = dataclasses.replace(call.translated.request, priority=priority)
        call = dataclasses.replace(call, translated=dataclasses.replace(call.translated, request=request))
    return call


def raise_if_error(output: RequestOutput, translated: Translated) -> None:
    """ServiceError (the request's field named) for an output that finished with an error."""
    if output.finish_reason == FinishReason.ERROR:
        logger.info("request %s failed: %s", output.request_id, output.error)
        raise error_from_output(output, translated.request.constraint_field)


def parsed_body(model: type[BodyModel], raw: bytes, unsupported_by: str | None = None) -> BodyModel:
    """`raw` validated as `model`, else Refused: a 400 naming the first bad field. With
    `unsupported_by`, a field `model` forbids is refused as not supported by that API."""
    try:
        return model.model_validate_json(raw)
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        path = field_path(first["loc"])
        if first["type"] == "json_invalid":
            raise Refused(bad_request(f"the request body is not valid JSON: {first['msg']}")) from None
        if first["type"] == "extra_forbidden" and unsupported_by is not None:
            raise Refused(bad_request(f"{path}: not supported by {unsupported_by}", path)) from None
        raise Refused(bad_request(f"{path or 'body'}: {first['msg']}", path or None)) from None


def _translated(translate: Any) -> Translated:
    """A bad field fails here, before anything runs (translation raises ServiceError)."""
    try:
        return translate()
    except ServiceError as e:
        raise Refused(http_error(e)) from None
