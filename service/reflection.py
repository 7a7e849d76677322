"""Descriptors for server reflection, both protocol versions.

grpcio-reflection ships only `grpc.reflection.v1alpha` (the one grpcurl 1.8.6 speaks); newer
clients ask for `grpc.reflection.v1`. The two are the same messages under another package name,
identical on the wire, so v1 is served by the v1alpha servicer (service/server.py) and this module
only adds a v1 file descriptor — v1alpha's, renamed — to the pool, so that v1 can describe itself.
"""
from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha  # messages only: no grpc import

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
