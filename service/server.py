"""The gRPC server: the Generation servicer, health, reflection, and the server's states.

With service/grpc_access.py (API keys, per-key limits) the only modules of service/ that import grpc;
everything it serves is computed by AsyncLLM and service/conversion.py on plain messages. States
(service/lifecycle.py runs them in a process):

    start()    bind the port, health NOT_SERVING, load the engine and warm it up in the background
    ready      health SERVING
    engine death   health NOT_SERVING; in-flight and new calls get UNAVAILABLE; the supervisor
               (service/supervisor.py) restarts the engine, and health is SERVING again once warm
    drain()    (SIGTERM / SIGINT in lifecycle.serve(), for the drain delay) health NOT_SERVING for good, calls
               still taken: a load balancer's health check sees it and stops sending new ones
    stop()     health NOT_SERVING, refuse new calls, let in-flight requests finish for the grace
               period, end the rest as FINISH_REASON_CANCELLED
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

from engine.frontend.core_client import EngineCoreClient
from engine.frontend.output_processor import RequestOutput
from engine.protocol import FinishReason
from engine.sampling_params import SamplingParams
from service import conversion
from service._gen.formwork.v1 import generation_pb2 as pb
from service._gen.formwork.v1 import generation_pb2_grpc as pb_grpc
from service.assistant_output import AssistantStream
from service.async_llm import AsyncLLM
from service.chat_format import OutputShape
from service.errors import ServiceError, StatusCode, invalid_argument
from service.limits import ServiceLimits
from service.quarantine import Quarantine
from service.reflection import V1_SERVICE, V1ALPHA_SERVICE, add_v1_descriptor
from service.request_decoding import UndecodableRequest, tolerant_deserializer
from service.grpc_access import GENERATION_SERVICE, AccessInterceptor, abort
from service.security import KeyLimiter, SecurityConfig
from service.supervisor import EngineSupervisor, RestartPolicy
from service.telemetry import Telemetry

logger = logging.getLogger(__name__)

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass(frozen=True)
class _Prepared:
    request_id: str  # the client's, or assigned
    engine_request_id: str  # unique in the engine
    prompt_token_ids: list[int]
    prompt_field: str
    params: SamplingParams
    arrival_time: float
    shape: OutputShape  # how the output is read back (think section, tool calls)


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
            prepared = await self._prepare(request)
            final = None
            async with contextlib.aclosing(self._generate(prepared, request, stream=False)) as outputs:
                async for final in outputs:
                    pass
            assert final is not None
            return conversion.generate_response(final, prepared.request_id, self._llm.token_text, delta=False,
                                                shape=prepared.shape)

    async def GenerateStream(self, request: pb.GenerateRequest,
                             context: grpc.aio.ServicerContext) -> AsyncIterator[pb.GenerateResponse]:
        # a generator, not context.write: interceptors (tracing) wrap a streaming handler by iterating it
        async with _status(context, self._rejected):
            _check_decoded(request, "GenerateStream")
            prepared = await self._prepare(request)
            reader = None if prepared.shape.plain else AssistantStream(prepared.shape)
            async with contextlib.aclosing(self._generate(prepared, request, stream=True)) as outputs:
                async for output in outputs:
                    yield conversion.generate_response(output, prepared.request_id, self._llm.token_text, delta=True,
                                                       shape=prepared.shape, reader=reader)

    async def ValidateConstraint(self, request: pb.ValidateConstraintRequest,
                                 context: grpc.aio.ServicerContext) -> pb.ValidateConstraintResponse:
        async with _status(context):
            _check_decoded(request, "ValidateConstraint")
            self._llm.check_available()
            field = conversion.constraint_field(request)
            if field is None:
                raise invalid_argument("constraint", "set one of json_schema, json_schema_text, json_object, regex, "
                                                     "grammar, choice")
            try:
                constraint = conversion.constraint_from_proto(request.constraint, self._limits)
            except ServiceError as e:  # a bad constraint is this RPC's answer, not its failure
                return pb.ValidateConstraintResponse(ok=False, error=e.message)
            report = await self._llm.validate_constraint(constraint, field)
            return conversion.validate_constraint_response(report)

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext) -> pb.ModelInfo:
        async with _status(context):
            _check_decoded(request, "GetModelInfo")
            stats = await self._llm.get_stats()
            assert self._llm.info is not None
            supervisor = self._supervisor
            return conversion.model_info(self._llm.info, stats, self._limits, self._llm.num_in_flight,
                                         conversion.RestartStats(supervisor.num_restarts, supervisor.last_crash,
                                                                 supervisor.quarantine.num_quarantined),
                                         self._llm.chat_format)

    async def Tokenize(self, request: pb.TokenizeRequest, context: grpc.aio.ServicerContext) -> pb.TokenizeResponse:
        async with _status(context):
            _check_decoded(request, "Tokenize")
            self._llm.check_available()
            assert self._llm.info is not None and self._llm.tokenizer is not None
            prompt = conversion.prompt_from_proto(request, self._llm.info.vocab_size)
            prompt = self._llm.chat_format.render(request, prompt, self._limits)
            token_ids, rendered = await self._llm.encode_prompt(prompt)
            tokens = self._llm.tokenizer.convert_ids_to_tokens(token_ids)
            return pb.TokenizeResponse(token_ids=token_ids, tokens=[t or "" for t in tokens],
                                       rendered_prompt=rendered or "")

    # ---- helpers ------------------------------------------------------------------------------

    def _rejected(self, code: StatusCode) -> None:
        self._llm.telemetry.request_rejected("grpc", code.name)

    async def _prepare(self, request: pb.GenerateRequest) -> _Prepared:
        arrival_time = time.monotonic()
        self._llm.check_available()
        info = self._llm.info
        assert info is not None
        if len(request.request_id) > self._limits.max_request_id_len:
            raise invalid_argument("request_id", f"is {len(request.request_id)} characters; the limit is "
                                                 f"{self._limits.max_request_id_len}")
        prompt = conversion.prompt_from_proto(request, info.vocab_size)
        params = conversion.sampling_params_from_proto(request, self._limits, info.vocab_size)
        plan = self._llm.chat_format.plan(request, params.constraint, self._limits)
        params, prompt = plan.sampling(params), plan.prompt(prompt)
        token_ids, _ = await self._llm.encode_prompt(prompt)
        number = next(self._ids)
        request_id = request.request_id or f"req-{number}"
        # the client's id need not be unique; the engine's must be
        return _Prepared(request_id, f"{request_id}#{number}", token_ids, prompt.field, params, arrival_time,
                         plan.shape)

    async def _generate(self, prepared: _Prepared, request: pb.GenerateRequest,
                        stream: bool) -> AsyncIterator[RequestOutput]:
        """AsyncLLM.generate, with an ERROR output turned into the RPC's status."""
        async with contextlib.aclosing(self._llm.generate(
                prepared.prompt_token_ids, prepared.params, request_id=prepared.engine_request_id,
                priority=request.priority, arrival_time=prepared.arrival_time, stream=stream,
                prompt_field=prepared.prompt_field, constraint_field=conversion.constraint_field(request))) as outputs:
            async for output in outputs:
                if output.finish_reason == FinishReason.ERROR:
                    logger.info("request %s failed: %s", prepared.engine_request_id, output.error)
                    raise conversion.error_from_output(output, conversion.constraint_field(request))
                yield output


def _check_decoded(request: object, method: str) -> None:
    """Answer a request whose bytes did not decode with INVALID_ARGUMENT, logged as one line."""
    if isinstance(request, UndecodableRequest):
        logger.info("%s: refused an undecodable request: %s %s", method, request.field, request.description)
        raise invalid_argument(request.field, request.description)


def add_generation_servicer(servicer: GenerationServicer, server: grpc.aio.Server) -> None:
    """The generated add_GenerationServicer_to_server, with deserializers that never raise
    (service/request_decoding.py), so bad bytes get INVALID_ARGUMENT instead of UNKNOWN."""
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
                  on_error: Callable[[StatusCode], None] | None = None) -> AsyncIterator[None]:
    """End the RPC with the status of a ServiceError (rich details in the trailer); any other
    exception is a bug: INTERNAL, logged. Cancellation passes through. `on_error` hears the code."""
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
            on_error(StatusCode.INTERNAL)
        await abort(context, ServiceError(StatusCode.INTERNAL, f"internal error: {type(e).__name__}: {e}"))


def _v1_reflection_handler(servicer: reflection.aio.ReflectionServicer) -> grpc.GenericRpcHandler:
    """grpc.reflection.v1 served by the v1alpha servicer: the messages are identical on the wire."""
    method = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString)
    return grpc.method_handlers_generic_handler(V1_SERVICE, {"ServerReflectionInfo": method})


class GenerationServer:
    """One gRPC server in front of one engine core client."""

    def __init__(self, client: EngineCoreClient, limits: ServiceLimits, host: str = "127.0.0.1",
                 port: int = 50051, warm_up: bool = True, security: SecurityConfig = SecurityConfig(),
                 restart_policy: RestartPolicy = RestartPolicy(), telemetry: Telemetry | None = None) -> None:
        quarantine = Quarantine(restart_policy.quarantine_s)
        self.llm = AsyncLLM(client, limits, quarantine, telemetry)
        self.telemetry = self.llm.telemetry
        self.supervisor = EngineSupervisor(self.llm, restart_policy, quarantine, self._set_serving)
        self.limits = limits
        self.host = host
        self.port = port  # the bound port once started (useful with port 0)
        self.security = security
        # calls in flight per key, over gRPC and HTTP together
        self.key_limiter = KeyLimiter(security.max_concurrent_per_key)
        self._warm_up = warm_up
        self.health = health.aio.HealthServicer()
        interceptors = []
        if security.api_keys:
            interceptors.append(AccessInterceptor(security, self.key_limiter))
        if self.telemetry.tracing is not None:  # inside the access checks: a refused call has no span
            interceptors.append(self.telemetry.tracing.grpc_interceptor(GENERATION_SERVICE))
        self.server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", limits.max_message_bytes),
            ("grpc.max_send_message_length", limits.max_message_bytes),
            ("grpc.so_reuseport", 0),  # a port in use is an error, not a shared port
        ], interceptors=interceptors or None)
        add_generation_servicer(GenerationServicer(self.llm, limits, self.supervisor), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        add_v1_descriptor()
        reflection_servicer = reflection.aio.ReflectionServicer(
            (GENERATION_SERVICE, health.SERVICE_NAME, V1ALPHA_SERVICE, V1_SERVICE))
        reflection_pb2_grpc.add_ServerReflectionServicer_to_server(reflection_servicer, self.server)
        self.server.add_generic_rpc_handlers([_v1_reflection_handler(reflection_servicer)])
        self.ready = asyncio.Event()
        self._serving = False
        self._draining = False
        self._startup: asyncio.Task[None] | None = None
        self._supervision: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Bind and serve (health NOT_SERVING) and start loading the engine; returns the port."""
        await self._set_health(_NOT_SERVING)
        warning = self.security.exposure_warning(self.host)
        if warning:
            logger.warning("%s", warning)
        address, tls = f"{self.host}:{self.port}", self.security.tls
        if tls is None:
            self.port = self.server.add_insecure_port(address)
        else:
            credentials = grpc.ssl_server_credentials(
                [(tls.private_key, tls.certificate_chain)], root_certificates=tls.client_ca,
                require_client_auth=tls.client_ca is not None)
            self.port = self.server.add_secure_port(address, credentials)
        await self.server.start()
        self._startup = asyncio.create_task(self._load())
        return self.port

    async def wait_started(self) -> None:
        """Return once the engine is loaded and warm; raise if it failed to start."""
        assert self._startup is not None
        await self._startup

    async def _load(self) -> None:
        started = time.monotonic()
        info = await self.llm.start()
        if self._warm_up:
            await self.llm.warm_up()
        if not self._draining:
            await self._set_health(_SERVING)
        self.ready.set()
        self._supervision = asyncio.create_task(self.supervisor.run())
        logger.info("%s loaded and warm in %.1f s", info.model_name, time.monotonic() - started)

    async def drain(self) -> None:
        """Report NOT_SERVING from now on (an engine restart does not bring SERVING back); calls
        are still served until stop()."""
        self._draining = True
        await self._set_health(_NOT_SERVING)

    async def _set_serving(self, serving: bool) -> None:
        if not self.llm.closing and not self._draining:
            await self._set_health(_SERVING if serving else _NOT_SERVING)

    @property
    def serving(self) -> bool:
        """What health reports: loaded and warm, the engine up (not restarting), not stopping."""
        return self._serving and self.llm.client.is_alive and not self.llm.closing

    async def _set_health(self, status: int) -> None:
        self._serving = status == _SERVING
        for name in ("", GENERATION_SERVICE):
            await self.health.set(name, status)

    async def stop(self, grace_s: float | None = None) -> None:
        """Graceful stop: refuse new calls, give in-flight requests `grace_s` (default: the limit)
        to finish, end the rest with FINISH_REASON_CANCELLED, then stop the engine."""
        grace_s = self.limits.shutdown_grace_s if grace_s is None else grace_s
        await self.health.enter_graceful_shutdown()
        self.llm.stop_accepting()
        if self._startup is not None and not self._startup.done():
            self._startup.cancel()
        logger.info("stopping: %d requests in flight, %.0f s grace", self.llm.num_in_flight, grace_s)
        # new RPCs are refused from now; grpc cancels handlers still running at the end
        server_stopped = asyncio.create_task(self.server.stop(grace_s + 5.0))
        deadline = time.monotonic() + grace_s
        while self.llm.num_in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.llm.num_in_flight:
            logger.warning("grace period over: cancelling %d requests", self.llm.abort_all())
        await server_stopped
        if self._supervision is not None:
            self._supervision.cancel()
        await self.llm.shutdown()
        self.telemetry.shutdown()
