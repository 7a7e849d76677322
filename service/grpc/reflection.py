"""Server reflection, both protocol versions (what grpcurl uses instead of the .proto files).

grpcio-reflection ships only `grpc.reflection.v1alpha` (the one grpcurl 1.8.6 speaks); newer
clients ask for `grpc.reflection.v1`. The two are the same messages under another package name,
identical on the wire, so v1 is served by the v1alpha servicer, and a v1 file descriptor —
v1alpha's, renamed — is added to the pool, so that v1 can describe itself.
"""
from __future__ import annotations

from collections.abc import Sequence

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha

V1ALPHA_SERVICE = "grpc.reflection.v1alpha.ServerReflection"
V1_SERVICE = "grpc.reflection.v1.ServerReflection"
V1_FILE = "grpc/reflection/v1/reflection.proto"


def add_v1_descriptor(pool: descriptor_pool.DescriptorPool | None = None) -> None:
    """Add grpc/reflection/v1/reflection.proto to `pool` (the default pool); idempotent."""
    pool = pool or descriptor_pool.Default()
    try:
        pool.FindFileByName(V1_FILE)
        return
    except KeyError:
        pass
    file_proto = descriptor_pb2.FileDescriptorProto()
    v1alpha.DESCRIPTOR.CopyToProto(file_proto)
    old_package, new_package = file_proto.package, "grpc.reflection.v1"
    file_proto.name = V1_FILE
    file_proto.package = new_package
    file_proto.ClearField("options")  # java/go package options name v1alpha's packages
    for message in file_proto.message_type:
        for field in message.field:
            if field.type_name.startswith(f".{old_package}."):
                field.type_name = f".{new_package}." + field.type_name[len(old_package) + 2:]
    for service in file_proto.service:
        for method in service.method:
            method.input_type = method.input_type.replace(f".{old_package}.", f".{new_package}.")
            method.output_type = method.output_type.replace(f".{old_package}.", f".{new_package}.")
    pool.Add(file_proto)


def add_reflection(server: grpc.aio.Server, services: Sequence[str]) -> None:
    """Serve reflection for `services` (and for itself) over v1alpha and v1."""
    add_v1_descriptor()
    servicer = reflection.aio.ReflectionServicer((*services, V1ALPHA_SERVICE, V1_SERVICE))
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    server.add_generic_rpc_handlers([_v1_handler(servicer)])


def _v1_handler(servicer: reflection.aio.ReflectionServicer) -> grpc.GenericRpcHandler:
    """grpc.reflection.v1 served by the v1alpha servicer: the messages are identical on the wire."""
    method = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=v1alpha.ServerReflectionRequest.FromString,
        response_serializer=v1alpha.ServerReflectionResponse.SerializeToString)
    return grpc.method_handlers_generic_handler(V1_SERVICE, {"ServerReflectionInfo": method})
