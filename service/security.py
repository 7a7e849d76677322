"""Who may call the server: TLS files, API keys, and the per-key limit on concurrent requests.

Plain Python (no grpc): service/grpc/ turns these into grpc credentials and an interceptor.
Keys are compared in constant time, every key every time, so neither the answer nor its timing
tells a caller how close a guess came; nothing about which keys exist is ever sent back or logged.
"""
from __future__ import annotations

import hmac
import ipaddress
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

API_KEY_ENV = "FORMWORK_API_KEY"  # one key, or several separated by commas
_BEARER = "bearer "


@dataclass(frozen=True)
class TlsFiles:
    """PEM contents: the server's certificate chain and private key, and (mutual TLS) the CA
    whose certificates clients must present."""

    certificate_chain: bytes
    private_key: bytes
    client_ca: bytes | None = None


@dataclass(frozen=True)
class SecurityConfig:
    """What `formwork serve` requires of a caller. The default requires nothing (loopback use)."""

    tls: TlsFiles | None = None
    api_keys: tuple[str, ...] = ()
    protect_health: bool = False  # grpc.health.v1 also needs a key (probes and load balancers then need one)
    max_concurrent_per_key: int = 0  # Generate / GenerateStream calls in flight per key; 0: no limit

    def __post_init__(self) -> None:
        if self.max_concurrent_per_key < 0:
            raise ValueError(f"max_concurrent_per_key must be >= 0, got {self.max_concurrent_per_key}")
        if self.max_concurrent_per_key and not self.api_keys:
            raise ValueError("a per-key limit needs API keys (--api-key, --api-key-file or $" + API_KEY_ENV + ")")
        if self.protect_health and not self.api_keys:
            raise ValueError("protecting health needs API keys")
        for key in self.api_keys:
            check_api_key(key)

    def exposure_warning(self, host: str) -> str | None:
        """A warning naming the risk of serving `host` as configured, or None when it is fine."""
        if is_loopback(host) or (self.tls is not None and self.api_keys):
            return None
        if self.tls is None and not self.api_keys:
            return (f"serving {host} without TLS or API keys: anyone who can reach the port can generate, read "
                    f"the model info and fill the queue (--tls-cert/--tls-key, --api-key)")
        if self.tls is None:
            return f"serving {host} without TLS: API keys and prompts cross the network in plaintext (--tls-cert/--tls-key)"
        return f"serving {host} with TLS but no API keys: any client that can connect may call (--api-key)"


def check_api_key(key: str) -> None:
    if not key or any(c.isspace() for c in key) or not key.isprintable():
        raise ValueError("an API key must be non-empty printable text without whitespace")


def load_api_keys(values: Iterable[str] = (), key_file: str | Path | None = None,
                  environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """Keys from flags, from a file (one a line; blank lines and # comments skipped), and from
    $FORMWORK_API_KEY (comma-separated), without duplicates, in that order."""
    keys = list(values)
    if key_file is not None:
        try:
            lines = Path(key_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"cannot read the API key file {key_file}: {e}") from None
        keys += [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    keys += [part.strip() for part in environ.get(API_KEY_ENV, "").split(",") if part.strip()]
    for key in keys:
        check_api_key(key)
    return tuple(dict.fromkeys(keys))


def load_tls_files(cert: str | Path | None, key: str | Path | None, client_ca: str | Path | None = None) -> TlsFiles | None:
    """The PEM files read once at start-up (a missing or unreadable one is a ValueError naming it)."""
    if cert is None and key is None:
        if client_ca is not None:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS first)")
        return None
    if cert is None or key is None:
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    return TlsFiles(_read_pem(cert, "--tls-cert"), _read_pem(key, "--tls-key"),
                    _read_pem(client_ca, "--tls-client-ca") if client_ca is not None else None)


def _read_pem(path: str | Path, flag: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"{flag} {path}: {e.strerror or e}") from None
    if b"-----BEGIN " not in data:
        raise ValueError(f"{flag} {path}: not a PEM file")
    return data


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost, or 0.0.0.0-style wildcard is not loopback


class ApiKeys:
    """The accepted keys; `identify` names the caller by the key's position, never by the key."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = [key.encode() for key in keys]

    def __bool__(self) -> bool:
        return bool(self._keys)

    def identify(self, authorization: str | None) -> int | None:
        """The index of the key an `authorization: Bearer KEY` value carries, or None."""
        if not authorization or authorization[:len(_BEARER)].lower() != _BEARER:
            return None
        offered = authorization[len(_BEARER):].strip().encode()
        found = None
        for index, key in enumerate(self._keys):  # no early exit: the time does not depend on which matched
            if hmac.compare_digest(offered, key) and found is None:
                found = index
        return found


class KeyLimiter:
    """Concurrent calls per key, bounded (thread-safe; a limit of 0 admits everything)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._in_flight: dict[int, int] = {}
        self._lock = threading.Lock()

    def try_acquire(self, key: int) -> bool:
        with self._lock:
            count = self._in_flight.get(key, 0)
            if self.limit and count >= self.limit:
                return False
            self._in_flight[key] = count + 1
            return True

    def release(self, key: int) -> None:
        with self._lock:
            count = self._in_flight.get(key, 0) - 1
            if count > 0:
                self._in_flight[key] = count
            else:
                self._in_flight.pop(key, None)

    def in_flight(self, key: int) -> int:
        with self._lock:
            return self._in_flight.get(key, 0)
