"""How a client reaches a server: plaintext or TLS (with a client certificate for mutual TLS),
the API key every call carries as `authorization: Bearer KEY` metadata, and the constraint key a
call with a constraint carries for a load balancer's routing."""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio

from formwork_client._gen.formwork.v1 import generation_pb2 as pb
from formwork_client.constraints import CONSTRAINT_KEY_HEADER, constraint_key

API_KEY_ENV = "FORMWORK_API_KEY"

Metadata = tuple[tuple[str, str], ...]


def auth_metadata(api_key: str | None) -> Metadata | None:
    """The call metadata for `api_key`, else for $FORMWORK_API_KEY, else None (no key sent)."""
    key = api_key if api_key is not None else os.environ.get(API_KEY_ENV) or None
    return (("authorization", f"Bearer {key}"),) if key else None


def call_metadata(metadata: Metadata | None, request: pb.GenerateRequest | pb.ValidateConstraintRequest
                  ) -> Metadata | None:
    """`metadata` plus the request's constraint key, when it has a constraint."""
    key = constraint_key(request.constraint) if request.HasField("constraint") else None
    if key is None:
        return metadata
    return (*(metadata or ()), (CONSTRAINT_KEY_HEADER, key))


def open_channel(address: str, *, tls: bool | None = None, root_certificates: bytes | None = None,
                 private_key: bytes | None = None, certificate_chain: bytes | None = None,
                 options: Sequence[tuple[str, Any]] = (), asyncio: bool = False) -> grpc.Channel | grpc.aio.Channel:
    """A channel to `address`: TLS when `tls` is true or any PEM is given (`root_certificates`:
    the CA to trust, default the system's; `private_key` + `certificate_chain`: the client's own
    certificate for mutual TLS), plaintext otherwise."""
    if (private_key is None) != (certificate_chain is None):
        raise ValueError("mutual TLS needs both private_key and certificate_chain")
    secure = tls if tls is not None else any(pem is not None for pem in (root_certificates, private_key,
                                                                           certificate_chain))
    if tls is False and root_certificates is not None:
        raise ValueError("tls=False contradicts root_certificates")
    grpc_module = grpc.aio if asyncio else grpc
    if not secure:
        return grpc_module.insecure_channel(address, options=list(options))
    credentials = grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain)
    return grpc_module.secure_channel(address, credentials, options=list(options))
