"""Who may call: API keys on every gRPC call and the per-key limit on concurrent generation calls,
applied by a server interceptor before any handler runs."""
from __future__ import annotations

import inspect

import grpc
from grpc_health.v1 import health

from service.errors import ErrorCode, ServiceError, overloaded
from service.grpc.servicer import GENERATION_SERVICE
from service.grpc.status import abort
from service.security import ApiKeys, KeyLimiter, SecurityConfig

GENERATE_METHODS = frozenset(f"/{GENERATION_SERVICE}/{name}" for name in ("Generate", "GenerateStream"))


class AccessInterceptor(grpc.aio.ServerInterceptor):
    """API keys on every call (grpc.health.v1 excepted unless protected) and the per-key limit on
    concurrent Generate / GenerateStream calls. A refused call gets its status before any handler runs."""

    def __init__(self, security: SecurityConfig, limiter: KeyLimiter) -> None:
        self._keys = ApiKeys(security.api_keys)
        self._limiter = limiter
        self._open_prefix = None if security.protect_health else f"/{health.SERVICE_NAME}/"

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        if self._open_prefix is not None and details.method.startswith(self._open_prefix):
            return await continuation(details)
        handler = await continuation(details)
        if handler is None:  # unknown method: grpc answers UNIMPLEMENTED
            return None
        authorization = next((value for name, value in details.invocation_metadata or ()
                              if name == "authorization"), None)
        key = self._keys.identify(authorization if isinstance(authorization, str) else None)
        if key is None:
            return _refusing(handler, ServiceError(
                ErrorCode.UNAUTHENTICATED, "missing or invalid API key: send the metadata 'authorization: Bearer <key>'"))
        if self._limiter.limit and details.method in GENERATE_METHODS:
            return _limited(handler, self._limiter, key)
        return handler


def _refusing(handler: grpc.RpcMethodHandler, error: ServiceError) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that answers `error` and runs nothing."""
    async def refuse(request, context):
        await abort(context, error)
    return _same_kind(handler, refuse)


def _limited(handler: grpc.RpcMethodHandler, limiter: KeyLimiter, key: int) -> grpc.RpcMethodHandler:
    behaviour = handler.unary_unary or handler.unary_stream

    async def call(request, context):
        if not limiter.try_acquire(key):
            await abort(context, overloaded(f"this API key already has {limiter.limit} requests in flight, the "
                                            f"server's limit per key (--max-concurrent-per-key)"))
        try:
            result = behaviour(request, context)
            if inspect.isasyncgen(result):  # a generator-style streaming handler
                async for response in result:
                    await context.write(response)
                return None
            return await result
        finally:
            limiter.release(key)
    return _same_kind(handler, call)


def _same_kind(handler: grpc.RpcMethodHandler, behaviour) -> grpc.RpcMethodHandler:
    if handler.unary_unary:
        make = grpc.unary_unary_rpc_method_handler
    elif handler.unary_stream:
        make = grpc.unary_stream_rpc_method_handler
    elif handler.stream_unary:
        make = grpc.stream_unary_rpc_method_handler
    else:
        make = grpc.stream_stream_rpc_method_handler
    return make(behaviour, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
