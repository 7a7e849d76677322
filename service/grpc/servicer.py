"""formwork.v1.Generation: each RPC maps its request onto the service's wire-neutral one
(service/grpc/requests.py), runs it on AsyncLLM, and answers with formwork.v1 messages
(service/grpc/responses.py); a ServiceError becomes the RPC's status (service/grpc/status.py).
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from engine.protocol import FinishReason
from service._gen.formwork.v1 import generation_pb2 as pb
from service._gen.formwork.v1 import generation_pb2_grpc as pb_grpc
from service.assistant_output import AssistantStream
from service.async_llm import AsyncLLM, PreparedRequest
from service.errors import ErrorCode, ServiceError, error_from_output, invalid_argument
from service.grpc import requests, responses
from service.grpc.request_decoding import UndecodableRequest, tolerant_deserializer
from service.grpc.status import abort
from service.limits import ServiceLimits
from service.supervisor import EngineSupervisor
from service.validation import check_prompt, engine_constraint

if TYPE_CHECKING:
    from engine.frontend.output_processor import RequestOutput

logger = logging.getLogger(__name__)

GENERATION_SERVICE = pb.DESCRIPTOR.services_by_name["Generation"].full_name


@dataclass(frozen=True)
class _Call:
    """One Generate / GenerateStream call, prepared."""

    request_id: str  # the client's, or assigned
    engine_request_id: str  # unique in the engine
    prepared: PreparedRequest
    priority: int
    constraint_field: str | None  # what errors about the constraint name
    arrival_time: float


class GenerationServicer(pb_grpc.GenerationServicer):
    """formwork.v1.Generation. A client's cancellation or deadline cancels the handler task; the
    generator it iterates is then closed, which aborts the request in the engine."""

    def __init__(self, llm: AsyncLLM, limits: ServiceLimits, supervisor: EngineSupervisor) -> None:
        self._llm = llm
        self._limits = limits
        self._supervisor = supervisor
        self._ids = itertools.count(1)

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> pb.GenerateResponse:
        async with _status(context, self._rejected):
            _check_decoded(request, "Generate")
            call = await self._prepare(request)
            final = None
            async with contextlib.aclosing(self._generate(call, stream=False)) as outputs:
                async for final in outputs:
                    pass
            assert final is not None
            return responses.generate_response(final, call.request_id, self._llm.token_text, delta=False,
                                               shape=call.prepared.shape)

    async def GenerateStream(self, request: pb.GenerateRequest,
                             context: grpc.aio.ServicerContext) -> AsyncIterator[pb.GenerateResponse]:
        # a generator, not context.write: interceptors (tracing) wrap a streaming handler by iterating it
        async with _status(context, self._rejected):
            _check_decoded(request, "GenerateStream")
            call = await self._prepare(request)
            shape = call.prepared.shape
            reader = None if shape.plain else AssistantStream(shape)
            async with contextlib.aclosing(self._generate(call, stream=True)) as outputs:
                async for output in outputs:
                    yield responses.generate_response(output, call.request_id, self._llm.token_text, delta=True,
                                                      shape=shape, reader=reader)

    async def ValidateConstraint(self, request: pb.ValidateConstraintRequest,
                                 context: grpc.aio.ServicerContext) -> pb.ValidateConstraintResponse:
        async with _status(context):
            _check_decoded(request, "ValidateConstraint")
            self._llm.check_available()
            if not request.HasField("constraint") or request.constraint.WhichOneof("kind") is None:
                raise invalid_argument("constraint", f"set one of {requests.CONSTRAINT_FIELDS}")
            field = f"constraint.{request.constraint.WhichOneof('kind')}"
            try:
                constraint = engine_constraint(requests.constraint_from_proto(request.constraint), self._limits)
            except ServiceError as e:  # a bad constraint is this RPC's answer, not its failure
                return pb.ValidateConstraintResponse(ok=False, error=e.message)
            report = await self._llm.validate_constraint(constraint, field)
            return responses.validate_constraint_response(report)

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext) -> pb.ModelInfo:
        async with _status(context):
            _check_decoded(request, "GetModelInfo")
            stats = await self._llm.get_stats()
            assert self._llm.info is not None
            supervisor = self._supervisor
            return responses.model_info(self._llm.info, stats, self._limits, self._llm.num_in_flight,
                                        responses.RestartStats(supervisor.num_restarts, supervisor.last_crash,
                                                               supervisor.quarantine.num_quarantined),
                                        self._llm.chat_format)

    async def Tokenize(self, request: pb.TokenizeRequest, context: grpc.aio.ServicerContext) -> pb.TokenizeResponse:
        async with _status(context):
            _check_decoded(request, "Tokenize")
            self._llm.check_available()
            assert self._llm.info is not None and self._llm.tokenizer is not None
            prompt = check_prompt(requests.prompt_from_proto(request), self._llm.info.vocab_size)
            prompt = self._llm.chat_format.render(requests.chat_options_from_proto(request), prompt, self._limits)
            token_ids, rendered = await self._llm.encode_prompt(prompt)
            tokens = self._llm.tokenizer.convert_ids_to_tokens(token_ids)
            return pb.TokenizeResponse(token_ids=token_ids, tokens=[t or "" for t in tokens],
                                       rendered_prompt=rendered or "")

    # ---- helpers ------------------------------------------------------------------------------

    def _rejected(self, code: ErrorCode) -> None:
        self._llm.telemetry.request_rejected("grpc", code.name)

    async def _prepare(self, request: pb.GenerateRequest) -> _Call:
        arrival_time = time.monotonic()
        self._llm.check_available()
        if len(request.request_id) > self._limits.max_request_id_len:
            raise invalid_argument("request_id", f"is {len(request.request_id)} characters; the limit is "
                                                 f"{self._limits.max_request_id_len}")
        generation = requests.generation_request_from_proto(request)
        prepared = await self._llm.prepare(generation)
        number = next(self._ids)
        request_id = request.request_id or f"req-{number}"
        # the client's id need not be unique; the engine's must be
        return _Call(request_id, f"{request_id}#{number}", prepared, generation.priority, generation.constraint_field,
                     arrival_time)

    async def _generate(self, call: _Call, stream: bool) -> AsyncIterator[RequestOutput]:
        """AsyncLLM.generate, with an ERROR output turned into the RPC's status."""
        prompt = call.prepared.prompts[0]
        async with contextlib.aclosing(self._llm.generate(
                prompt.token_ids, call.prepared.params, request_id=call.engine_request_id, priority=call.priority,
                arrival_time=call.arrival_time, stream=stream, prompt_field=prompt.field,
                constraint_field=call.constraint_field)) as outputs:
            async for output in outputs:
                if output.finish_reason == FinishReason.ERROR:
                    logger.info("request %s failed: %s", call.engine_request_id, output.error)
                    raise error_from_output(output, call.constraint_field)
                yield output


def _check_decoded(request: object, method: str) -> None:
    """Answer a request whose bytes did not decode with INVALID_ARGUMENT, logged as one line."""
    if isinstance(request, UndecodableRequest):
        logger.info("%s: refused an undecodable request: %s %s", method, request.field, request.description)
        raise invalid_argument(request.field, request.description)


def add_generation_servicer(servicer: GenerationServicer, server: grpc.aio.Server) -> None:
    """The generated add_GenerationServicer_to_server, with deserializers that never raise
    (service/grpc/request_decoding.py), so bad bytes get INVALID_ARGUMENT instead of UNKNOWN."""
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name["Generation"].methods:
        request_class = getattr(pb, method.input_type.name)
        response_class = getattr(pb, method.output_type.name)
        make = grpc.unary_stream_rpc_method_handler if method.server_streaming else grpc.unary_unary_rpc_method_handler
        handlers[method.name] = make(getattr(servicer, method.name),
                                     request_deserializer=tolerant_deserializer(request_class),
                                     response_serializer=response_class.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(GENERATION_SERVICE, handlers),))
    server.add_registered_method_handlers(GENERATION_SERVICE, handlers)


@contextlib.asynccontextmanager
async def _status(context: grpc.aio.ServicerContext,
                  on_error: Callable[[ErrorCode], None] | None = None) -> AsyncIterator[None]:
    """End the RPC with the status of a ServiceError (rich details in the trailer); any other
    exception is a bug: INTERNAL, logged. Cancellation passes through. `on_error` hears the kind."""
    try:
        yield
    except ServiceError as e:
        if on_error is not None:
            on_error(e.code)
        await abort(context, e)
    except Exception as e:
        if isinstance(e, grpc.aio.AbortError):
            raise
        logger.exception("internal error")
        if on_error is not None:
            on_error(ErrorCode.INTERNAL)
        await abort(context, ServiceError(ErrorCode.INTERNAL, f"internal error: {type(e).__name__}: {e}"))
