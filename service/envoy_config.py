"""Envoy's configuration for N Formwork replicas: one function, used by `formwork cluster` (static
loopback endpoints) and for deploy/kubernetes/ (pods found through a headless Service's DNS).

    python -m service.envoy_config kubernetes > deploy/kubernetes/envoy-config.yaml   (the ConfigMap)

What it sets up, per API (gRPC on HTTP/2 upstreams, the OpenAI API on HTTP/1.1 upstreams):
* Two clusters over the same replicas. A request carrying `x-formwork-constraint-key` (the clients
  set it from the constraint) goes to a Maglev cluster that hashes that header, so a schema keeps
  meeting the replica whose compile cache already holds it; bounded load (hash_balance_factor)
  spills a hot key to the next replica instead of overloading one. Every other request goes to a
  least-request cluster.
* Active health checks: grpc.health.v1 for the gRPC clusters, GET /health (the same state: 503
  unless SERVING) for the HTTP/1.1 ones, which cannot speak gRPC. A replica that reports
  NOT_SERVING (starting, engine restarting, draining after SIGTERM) gets no new requests. Panic mode is off, so a draining replica never gets traffic back because others are down.
* Outlier ejection on consecutive gateway failures (connection resets, UNAVAILABLE).
* Retries only before any output: a connection that failed, a stream the replica refused or that
  was reset before the request was sent, a gRPC UNAVAILABLE in the headers (trailers-only: no
  output yet; Envoy also answers so for a replica that died before responding) or an HTTP 503
  (sent before any body), each on another replica. Generation has no side effects, so a repeat
  costs only work; a stream whose output has begun is never repeated.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

CONSTRAINT_KEY_HEADER = "x-formwork-constraint-key"  # formwork_client.CONSTRAINT_KEY_HEADER
REPLICA_HEADER = "x-formwork-replica"  # with expose_replica: the replica's address, on every response
HEALTH_SERVICE = "formwork.v1.Generation"
BALANCING = ("affinity", "round_robin")  # round_robin: no hashing at all (the benchmark's baseline)

_HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
_HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
_PREVIOUS_HOSTS = "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"


@dataclass(frozen=True)
class Upstreams:
    """Where the replicas are: `hosts` of (address, gRPC port, HTTP port) as they are (loopback),
    or `dns_name` resolved every `dns_refresh_s` into one host per address (Kubernetes' headless
    Service: STRICT_DNS), all on `grpc_port` / `http_port`."""

    hosts: Sequence[tuple[str, int, int]] = ()
    dns_name: str = ""
    grpc_port: int = 50051
    http_port: int = 8000
    dns_refresh_s: float = 5.0

    def __post_init__(self) -> None:
        if bool(self.hosts) == bool(self.dns_name):
            raise ValueError("give either hosts or dns_name")


@dataclass(frozen=True)
class EnvoySettings:
    grpc_listen: tuple[str, int] = ("0.0.0.0", 50051)
    http_listen: tuple[str, int] | None = ("0.0.0.0", 8000)  # None: no OpenAI API listener
    admin_listen: tuple[str, int] = ("127.0.0.1", 9901)
    health_interval_s: float = 2.0  # a draining replica stops getting requests within about this
    # a replica busy on a loaded machine may answer late; only one that does not answer at all within
    # this is taken out (a draining one answers NOT_SERVING at once, so the drain stays as fast)
    health_timeout_s: float = 5.0
    unhealthy_threshold: int = 1
    healthy_threshold: int = 1
    balancing: str = "affinity"
    hash_balance_factor: int = 150  # bounded load: no replica above 1.5x the average of its cluster
    expose_replica: bool = False

    def __post_init__(self) -> None:
        if self.balancing not in BALANCING:
            raise ValueError(f"balancing must be one of {', '.join(BALANCING)}, not {self.balancing!r}")
        for name in ("health_interval_s", "health_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


def envoy_config(upstreams: Upstreams, settings: EnvoySettings = EnvoySettings()) -> dict[str, Any]:
    """The bootstrap configuration (JSON-able: Envoy reads it as JSON or YAML)."""
    listeners = [_listener("grpc", settings.grpc_listen, grpc=True, settings=settings)]
    clusters = _clusters("grpc", upstreams, settings, http2=True)
    if settings.http_listen is not None:
        listeners.append(_listener("http", settings.http_listen, grpc=False, settings=settings))
        clusters += _clusters("http", upstreams, settings, http2=False)
    return {
        "admin": {"address": _address(*settings.admin_listen)},
        "static_resources": {"listeners": listeners, "clusters": clusters},
    }


def _listener(api: str, listen: tuple[str, int], grpc: bool, settings: EnvoySettings) -> dict[str, Any]:
    hashed, plain = _cluster_names(api, settings)
    retry = {
        "retry_on": ("unavailable,connect-failure,refused-stream,reset-before-request" if grpc
                     else "retriable-status-codes,connect-failure,refused-stream,reset-before-request"),
        "num_retries": 2,
        "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts",
                                  "typed_config": {"@type": _PREVIOUS_HOSTS}}],
        "host_selection_retry_max_attempts": 3,
    }
    if not grpc:
        retry["retriable_status_codes"] = [503]

    def action(cluster: str) -> dict[str, Any]:
        route: dict[str, Any] = {"cluster": cluster, "timeout": "0s", "retry_policy": retry}
        if grpc:  # the client's grpc-timeout is the deadline; none means none
            route["max_stream_duration"] = {"grpc_timeout_header_max": "0s"}
        if cluster == hashed and settings.balancing == "affinity":
            route["hash_policy"] = [{"header": {"header_name": CONSTRAINT_KEY_HEADER}}]
        return route

    match: dict[str, Any] = {"prefix": "/"}
    if grpc:
        match["grpc"] = {}
    keyed = {**match, "headers": [{"name": CONSTRAINT_KEY_HEADER, "present_match": True}]}
    routes = [{"match": keyed, "route": action(hashed)}, {"match": match, "route": action(plain)}]
    virtual_host: dict[str, Any] = {"name": f"formwork_{api}", "domains": ["*"], "routes": routes}
    if settings.expose_replica:
        virtual_host["response_headers_to_add"] = [
            {"header": {"key": REPLICA_HEADER, "value": "%UPSTREAM_REMOTE_ADDRESS%"}}]
    manager = {
        "@type": _HCM,
        "stat_prefix": f"formwork_{api}",
        "codec_type": "AUTO",
        "stream_idle_timeout": "0s",  # a constrained answer may think a long time before its first token
        "route_config": {"name": f"formwork_{api}", "virtual_hosts": [virtual_host]},
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER}}],
    }
    return {
        "name": f"formwork_{api}",
        "address": _address(*listen),
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                        "typed_config": manager}]}],
    }


def _cluster_names(api: str, settings: EnvoySettings) -> tuple[str, str]:
    if settings.balancing == "round_robin":
        return f"formwork_{api}_round_robin", f"formwork_{api}_round_robin"
    return f"formwork_{api}_by_constraint", f"formwork_{api}_least_request"


def _clusters(api: str, upstreams: Upstreams, settings: EnvoySettings, http2: bool) -> list[dict[str, Any]]:
    hashed, plain = _cluster_names(api, settings)
    if settings.balancing == "round_robin":
        return [_cluster(hashed, "ROUND_ROBIN", upstreams, settings, http2)]
    return [_cluster(hashed, "MAGLEV", upstreams, settings, http2),
            _cluster(plain, "LEAST_REQUEST", upstreams, settings, http2)]


def _cluster(name: str, policy: str, upstreams: Upstreams, settings: EnvoySettings,
             http2: bool) -> dict[str, Any]:
    interval = f"{settings.health_interval_s:g}s"
    common: dict[str, Any] = {"healthy_panic_threshold": {"value": 0.0}}
    if policy == "MAGLEV":
        common["consistent_hashing_lb_config"] = {"hash_balance_factor": settings.hash_balance_factor}
    cluster: dict[str, Any] = {
        "name": name,
        "connect_timeout": "1s",
        "lb_policy": policy,
        "common_lb_config": common,
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": _endpoints(upstreams, http2)}]},
        "typed_extension_protocol_options": {_HTTP_OPTIONS: {
            "@type": f"type.googleapis.com/{_HTTP_OPTIONS}",
            "explicit_http_config": {"http2_protocol_options": {}} if http2 else {"http_protocol_options": {}},
        }},
        "health_checks": [{
            "timeout": f"{settings.health_timeout_s:g}s",
            "interval": interval,
            "no_traffic_interval": interval,  # else a cluster that has seen no request checks once a minute
            "unhealthy_threshold": settings.unhealthy_threshold,
            "healthy_threshold": settings.healthy_threshold,
            **({"grpc_health_check": {"service_name": HEALTH_SERVICE}} if http2
               else {"http_health_check": {"path": "/health"}}),
        }],
        "outlier_detection": {
            "consecutive_gateway_failure": 3,
            "enforcing_consecutive_gateway_failure": 100,
            "consecutive_5xx": 5,
            "interval": "5s",
            "base_ejection_time": "10s",
            "max_ejection_percent": 50,
        },
    }
    if upstreams.dns_name:
        cluster.update({"type": "STRICT_DNS", "dns_refresh_rate": f"{upstreams.dns_refresh_s:g}s",
                        "respect_dns_ttl": True, "dns_lookup_family": "V4_PREFERRED"})
    else:
        cluster["type"] = "STATIC"
    return cluster


def _endpoints(upstreams: Upstreams, http2: bool) -> list[dict[str, Any]]:
    if upstreams.dns_name:
        hosts = [(upstreams.dns_name, upstreams.grpc_port, upstreams.http_port)]
    else:
        hosts = list(upstreams.hosts)
    endpoints = []
    for host, grpc_port, http_port in hosts:
        endpoints.append({"endpoint": {"address": _address(host, grpc_port if http2 else http_port)}})
    return endpoints


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


# ---- the Kubernetes ConfigMap (deploy/kubernetes/envoy-config.yaml) ------------------------------

KUBERNETES_DNS_NAME = "formwork-replicas.formwork.svc.cluster.local"  # the headless Service


def kubernetes_config_map() -> str:
    """The ConfigMap that deploy/kubernetes/envoy.yaml mounts, as YAML text."""
    import yaml  # PyYAML comes with the deploy extra (kubernetes-validate)

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: object) -> bool:
            return True  # shared dicts written out in full: no &id001 anchors

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    Dumper.add_representer(str, text)
    config = envoy_config(Upstreams(dns_name=KUBERNETES_DNS_NAME), EnvoySettings())
    config_map = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "formwork-envoy", "namespace": "formwork", "labels": {"app": "formwork-envoy"}},
        "data": {"envoy.yaml": yaml.dump(config, Dumper=Dumper, sort_keys=False)},
    }
    header = "# Generated by `python -m service.envoy_config kubernetes` (service/envoy_config.py); do not edit.\n"
    return header + yaml.dump(config_map, Dumper=Dumper, sort_keys=False, width=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service.envoy_config", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("kubernetes", "loopback"),
                        help="kubernetes: the ConfigMap of deploy/kubernetes/; loopback: JSON for replicas on "
                             "127.0.0.1:50051 and :50052 (HTTP 8001, 8002)")
    args = parser.parse_args(argv)
    if args.what == "kubernetes":
        sys.stdout.write(kubernetes_config_map())
    else:
        upstreams = Upstreams(hosts=[("127.0.0.1", 50051, 8001), ("127.0.0.1", 50052, 8002)])
        json.dump(envoy_config(upstreams, EnvoySettings(grpc_listen=("127.0.0.1", 50050))), sys.stdout, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
