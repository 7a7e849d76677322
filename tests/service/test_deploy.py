"""deploy/: the Envoy configuration (service/envoy_config.py) and the Kubernetes manifests, checked
offline: Envoy's own validator, kubernetes-validate's schemas, and the timings the drain needs."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from formwork_client import (CONSTRAINT_KEY_HEADER, choice, constraint_key, json_object, json_schema, pb, regex,
                             structural_tag)
from formwork_client.connection import call_metadata
from kubernetes_validate import utils as kubernetes

from service.cluster import envoy_binary
from service.envoy_config import (CONSTRAINT_KEY_HEADER as ROUTED_HEADER, EnvoySettings, Upstreams, envoy_config,
                              kubernetes_config_map)

REPO_ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = REPO_ROOT / "deploy" / "kubernetes"
LOOPBACK = Upstreams(hosts=[("127.0.0.1", 50061, 8061), ("127.0.0.1", 50062, 8062)])


def manifests() -> list[dict]:
    return [document for path in sorted(MANIFESTS.glob("*.yaml"))
            for document in yaml.safe_load_all(path.read_text()) if document]


def envoy_validates(config: dict, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "envoy.json"
    path.write_text(json.dumps(config))
    return subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(path), "--disable-hot-restart"],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("version", ["1.30.0", "1.37.0"])  # the preStop sleep action needs 1.30
@pytest.mark.parametrize("resource", manifests(), ids=lambda r: f"{r['kind']}/{r['metadata']['name']}")
def test_manifests_validate_against_the_kubernetes_schemas(resource, version):
    kubernetes.validate(resource, version, strict=True)  # raises ValidationError with the path at fault


def test_a_manifest_with_a_mistake_is_refused():
    deployment = next(r for r in manifests() if r["kind"] == "Deployment" and r["metadata"]["name"] == "formwork")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbe"]["grpc"]["port"] = "grpc"  # a grpc probe takes a number, not a port name
    with pytest.raises(kubernetes.ValidationError, match="'grpc' is not of type 'integer'"):
        kubernetes.validate(deployment, "1.37.0", strict=True)
    container["readinessProbe"]["grpc"]["port"] = 50051
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes.ValidationError, match="readinesProbe"):
        kubernetes.validate(deployment, "1.37.0", strict=True)


def test_envoy_config_map_is_generated_from_cli_envoy_config():
    assert (MANIFESTS / "envoy-config.yaml").read_text() == kubernetes_config_map(), \
        "run: python -m service.envoy_config kubernetes > deploy/kubernetes/envoy-config.yaml"


def test_envoy_accepts_the_kubernetes_loopback_and_round_robin_configs(tmp_path):
    config_map = next(r for r in manifests() if r["kind"] == "ConfigMap")
    configs = [yaml.safe_load(config_map["data"]["envoy.yaml"]), envoy_config(LOOPBACK),
               envoy_config(LOOPBACK, EnvoySettings(balancing="round_robin", expose_replica=True))]
    for config in configs:
        result = envoy_validates(config, tmp_path)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_envoy_refuses_a_broken_config(tmp_path):
    config = envoy_config(LOOPBACK)
    config["static_resources"]["clusters"][0]["lb_policy"] = "NO_SUCH_POLICY"
    assert envoy_validates(config, tmp_path).returncode != 0


def test_keyed_requests_hash_unkeyed_go_least_request_retries_stay_safe():
    config = envoy_config(LOOPBACK)
    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    for listener in config["static_resources"]["listeners"]:
        manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
        keyed, plain = manager["route_config"]["virtual_hosts"][0]["routes"]
        assert keyed["match"]["headers"] == [{"name": ROUTED_HEADER, "present_match": True}]
        assert keyed["route"]["hash_policy"] == [{"header": {"header_name": ROUTED_HEADER}}]
        assert clusters[keyed["route"]["cluster"]]["lb_policy"] == "MAGLEV"
        assert "headers" not in plain["match"] and "hash_policy" not in plain["route"]
        assert clusters[plain["route"]["cluster"]]["lb_policy"] == "LEAST_REQUEST"
        retry_on = set(keyed["route"]["retry_policy"]["retry_on"].split(","))
        assert not retry_on & {"5xx", "reset", "gateway-error", "cancelled", "deadline-exceeded", "internal"}
    for cluster in clusters.values():
        assert cluster["common_lb_config"]["healthy_panic_threshold"] == {"value": 0.0}
        (check,) = cluster["health_checks"]
        http2 = "http2_protocol_options" in json.dumps(cluster["typed_extension_protocol_options"])
        assert ("grpc_health_check" in check) == http2 == cluster["name"].startswith("formwork_grpc")
    assert ROUTED_HEADER == CONSTRAINT_KEY_HEADER


def test_upstreams_are_hosts_or_a_dns_name():
    with pytest.raises(ValueError, match="either hosts or dns_name"):
        Upstreams()
    with pytest.raises(ValueError, match="balancing"):
        EnvoySettings(balancing="random")
    dns = envoy_config(Upstreams(dns_name="formwork-replicas.example"))["static_resources"]["clusters"]
    assert {c["type"] for c in dns} == {"STRICT_DNS"}


def _argument(args: list[str], name: str) -> float:
    return float(args[args.index(name) + 1])


def test_the_termination_grace_period_covers_prestop_drain_and_grace():
    deployment = next(r for r in manifests() if r["kind"] == "Deployment" and r["metadata"]["name"] == "formwork")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    pre_stop_s = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    needed_s = pre_stop_s + _argument(container["args"], "--drain-delay") + _argument(container["args"],
                                                                                       "--shutdown-grace")
    assert pod["terminationGracePeriodSeconds"] > needed_s
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"] == {"port": 50051, "service": "formwork.v1.Generation"}
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    service = next(r for r in manifests() if r["metadata"]["name"] == "formwork-replicas")
    assert service["spec"]["clusterIP"] == "None"


def test_the_clients_send_the_same_constraint_key():
    constraints = [regex("[0-9]{3}"), json_schema({"type": "object", "properties": {"é": {"type": "string"}}}),
                   choice(["red", "green"]), json_object(),
                   structural_tag({"type": "structural_tag", "format": {"type": "const_string", "value": "é"}})]
    keys = [constraint_key(c) for c in constraints]
    assert len(set(keys)) == len(keys) and all(len(k) == 32 for k in keys)
    assert constraint_key(pb.Constraint()) is None
    # options do not change what compiles from the text, so they do not move the request
    assert constraint_key(regex("[0-9]{3}", strict=False)) == keys[0]
    request = pb.GenerateRequest(prompt="x", constraint=constraints[0])
    assert call_metadata((("authorization", "Bearer k"),), request) == (
        ("authorization", "Bearer k"), (CONSTRAINT_KEY_HEADER, keys[0]))
    assert call_metadata(None, pb.GenerateRequest(prompt="x")) is None
    script = """
      import { choice, constraintKey, jsonObject, jsonSchema, regex, structuralTag }
        from "./clients/node/src/constraints.js";
      console.log(JSON.stringify([regex("[0-9]{3}"), jsonSchema({type: "object", properties: {"é": {type: "string"}}}),
                                  choice(["red", "green"]), jsonObject(),
                                  structuralTag({type: "structural_tag", format: {type: "const_string", value: "é"}})]
                                 .map(constraintKey)));
    """
    node = subprocess.run(["node", "--input-type=module", "-e", script], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60)
    assert node.returncode == 0, node.stderr
    assert json.loads(node.stdout) == keys
