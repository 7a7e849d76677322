"""An Executor over a running Formwork gRPC server: each OpenAI body read and checked as the HTTP
API reads it (service/http/answerer.py), sent as formwork.v1 Generate calls, and each answer built
back into the response object the HTTP API would send, by the same code (service/http/responses.py,
response_object.py) from RequestOutputs rebuilt from the GenerateResponses.

The output is read back (think section, tool calls) with the server's own chat format, from
GetModelInfo. What differs from the HTTP API on the same server: a Responses API answer's
`output_tokens_details.reasoning_tokens` is 0 (counting them needs the tokenizer), and the ids
(`chatcmpl-...`) are made here.
"""
from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

from engine.frontend.output_processor import RequestOutput, RequestTimings
from engine.protocol import FinishReason, RequestCounters, TokenLogprob
from grammar.chat.reasoning import ReasoningMarkers
from grammar.chat.tool_calls import SYNTAXES
from service._gen.formwork.v1 import generation_pb2 as pb
from service._gen.formwork.v1 import generation_pb2_grpc as pb_grpc
from service.assistant_output import OutputShape
from service.batch.executor import Executor, ExecutorUnavailable
from service.batch_cli.grpc_request import generate_requests
from service.errors import ErrorCode, FieldViolation, ServiceError
from service.grpc.status import STATUS_DETAILS_KEY
from service.http import responses
from service.http.answerer import CHAT_COMPLETIONS, RESPONSES, Call, Refused, read_call
from service.http.errors import http_error, not_found
from service.http.protocol import ChatCompletionRequest
from service.http.response_object import ResponseHeader, whole_response
from service.http.response_request import ResponsesRequest
from service.request import GenerationRequest

_FINISH_REASON = {pb.FINISH_REASON_STOP: FinishReason.STOP, pb.FINISH_REASON_LENGTH: FinishReason.LENGTH,
                  pb.FINISH_REASON_CANCELLED: FinishReason.ABORT, pb.FINISH_REASON_ERROR: FinishReason.ERROR}


class GrpcExecutor(Executor):
    def __init__(self, channel: grpc.aio.Channel, info: pb.ModelInfo, *, api_key: str | None = None,
                 priority: int | None = None, max_message_bytes: int, concurrency: int = 64) -> None:
        self._channel = channel
        self._stub = pb_grpc.GenerationStub(channel)
        self.info = info
        self._metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self._priority = priority
        self._max_message_bytes = max_message_bytes
        self.preferred_concurrency = concurrency

    @classmethod
    async def connect(cls, address: str, *, api_key: str | None = None, priority: int | None = None,
                      max_message_bytes: int, timeout_s: float = 30.0) -> GrpcExecutor:
        """Connect to HOST:PORT and read the server's model info; ExecutorUnavailable when it
        cannot be reached (or is still loading) within `timeout_s`."""
        channel = grpc.aio.insecure_channel(address, options=[("grpc.max_receive_message_length", -1)])
        metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        try:
            info = await pb_grpc.GenerationStub(channel).GetModelInfo(pb.GetModelInfoRequest(), metadata=metadata,
                                                                      timeout=timeout_s, wait_for_ready=True)
        except grpc.aio.AioRpcError as e:
            await channel.close()
            raise ExecutorUnavailable(f"{address}: {e.code().name}: {e.details()}") from None
        return cls(channel, info, api_key=api_key, priority=priority, max_message_bytes=max_message_bytes)

    async def execute(self, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            call = read_call(url, body, self._max_message_bytes, priority=self._priority)
            return 200, await self._answer(call)
        except Refused as e:
            return e.error.status, e.error.body()

    async def aclose(self) -> None:
        await self._channel.close()

    async def _answer(self, call: Call) -> dict[str, Any]:
        translated = call.translated
        model = call.body.model
        if model not in (None, self.info.model_name):
            raise Refused(not_found(f"the model '{model}' does not exist; this server serves "
                                    f"'{self.info.model_name}'", "model_not_found"))
        try:
            requests = generate_requests(translated.request, translated.num_choices)
            answers = await asyncio.gather(*(self._stub.Generate(r, metadata=self._metadata) for r in requests))
        except ServiceError as e:
            raise Refused(http_error(*translated.field_names.rename(e))) from None
        except grpc.aio.AioRpcError as e:
            raise Refused(http_error(*translated.field_names.rename(_service_error(e)))) from None
        finals = [_request_output(a) for a in answers]
        token_text = _token_texts(answers)
        shape = self._shape(translated.request, call.path)
        created = int(time.time())
        if call.path == RESPONSES:
            assert isinstance(call.body, ResponsesRequest)
            header = ResponseHeader(f"resp_{secrets.token_hex(12)}", created, self.info.model_name, call.body, shape,
                                    lambda text: 0)
            return whole_response(header, finals[0])
        if call.path == CHAT_COMPLETIONS:
            assert isinstance(call.body, ChatCompletionRequest)
            return responses.chat_completion(f"chatcmpl-{secrets.token_hex(12)}", created, self.info.model_name,
                                             finals, token_text, bool(call.body.logprobs), shape)
        return responses.completion(f"cmpl-{secrets.token_hex(12)}", created, self.info.model_name, finals,
                                    translated.num_choices, token_text, call.body.logprobs is not None)

    def _shape(self, request: GenerationRequest, path: str) -> OutputShape:
        """How the server reads this request's output back, as its chat format plans it."""
        if path not in (CHAT_COMPLETIONS, RESPONSES):
            return OutputShape()
        chat = request.chat
        syntax = SYNTAXES.get(self.info.tool_call_syntax) if chat.tools and chat.tool_choice != "none" else None
        reasoning = None
        if self.info.reasoning_end and chat.thinking is not False:
            reasoning = ReasoningMarkers(self.info.reasoning_start, self.info.reasoning_end)
        return OutputShape(syntax, reasoning)


def _service_error(error: grpc.aio.AioRpcError) -> ServiceError:
    """A gRPC error as the ServiceError the server raised: its code, message and field violations."""
    code = ErrorCode.__members__.get(error.code().name, ErrorCode.INTERNAL)
    violations = []
    for key, value in error.trailing_metadata() or ():
        if key == STATUS_DETAILS_KEY:
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                bad_request = error_details_pb2.BadRequest()
                if detail.Unpack(bad_request):
                    violations += [FieldViolation(v.field, v.description) for v in bad_request.field_violations]
    return ServiceError(code, error.details() or error.code().name, violations)


def _request_output(answer: pb.GenerateResponse) -> RequestOutput:
    usage, timings = answer.usage, answer.timings
    stop_reason: str | int | None = None
    if answer.HasField("stop_string"):
        stop_reason = answer.stop_string
    elif answer.HasField("stop_token_id"):
        stop_reason = answer.stop_token_id
    return RequestOutput(
        answer.request_id, answer.text, "", list(answer.token_ids), [], finished=True,
        finish_reason=_FINISH_REASON.get(answer.finish_reason, FinishReason.STOP), stop_reason=stop_reason,
        num_prompt_tokens=usage.prompt_tokens, num_output_tokens=usage.completion_tokens,
        counters=RequestCounters(num_prompt_tokens=usage.prompt_tokens, num_cached_tokens=usage.cached_prompt_tokens,
                                 num_forward_passes=timings.forward_passes, num_forced_tokens=usage.forced_tokens,
                                 num_draft_tokens=usage.draft_tokens,
                                 num_accepted_draft_tokens=usage.accepted_draft_tokens,
                                 queued_s=timings.queued_s, grammar_wait_s=timings.grammar_wait_s),
        timings=RequestTimings(timings.queued_s, timings.grammar_wait_s, timings.time_to_first_token_s,
                               timings.total_s) if answer.HasField("timings") else None,
        logprobs=[TokenLogprob(lp.token_id, lp.logprob, [(t.token_id, t.logprob) for t in lp.top])
                  for lp in answer.logprobs] or None,
        not_enforced=list(answer.not_enforced), closed_early=answer.closed_early)


def _token_texts(answers: list[pb.GenerateResponse]) -> Any:
    """token id -> its text, as the server wrote it in the answers' logprobs."""
    texts: dict[int, str] = {}
    for answer in answers:
        for logprob in answer.logprobs:
            texts[logprob.token_id] = logprob.token
            texts.update((top.token_id, top.token) for top in logprob.top)
    return lambda token_id: texts.get(token_id, "")

