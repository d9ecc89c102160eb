"""The manifests for the gateways teams already run (deploy/kubernetes/gateways), rendered by
kustomize and checked against the real schemas: each custom resource against its CRD's
openAPIV3Schema from ../shared/k8s-crds (unknown fields refused, as the API server's strict field
validation does), each built-in kind with kubernetes-validate. A wrong field must fail the check."""

from __future__ import annotations

import copy
import subprocess
from functools import lru_cache

import jsonschema
import kubernetes_validate
import pytest
import yaml

from devstack.envoy_binary import find_envoy
from tests.support import ROOT
from tests.support.gateways import patch_policy_parts
from tests.support.deploy import K8S, K8S_VERSION, kustomize

# Every check here reads manifests the real kustomize renders.
pytestmark = pytest.mark.processes

CRDS = ROOT.parent / "shared" / "k8s-crds"
GATEWAYS = ["inference-extension", "envoy-gateway", "ai-gateway"]


def strict(schema: dict) -> dict:
    """The schema with unknown fields refused wherever it names its fields (and does not keep
    unknown ones): structural CRD schemas prune them silently, which would hide a misspelling."""
    schema = dict(schema)
    if "properties" in schema and "additionalProperties" not in schema \
            and not schema.get("x-kubernetes-preserve-unknown-fields"):
        schema["additionalProperties"] = False
    for key in ("properties", "patternProperties"):
        if key in schema:
            schema[key] = {k: strict(v) for k, v in schema[key].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            schema[key] = strict(schema[key])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in schema:
            schema[key] = [strict(s) for s in schema[key]]
    return schema


@lru_cache(maxsize=1)
def crd_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> the strict schema of every served version of every CRD."""
    if not CRDS.is_dir():
        pytest.fail(f"the gateways' CRDs are needed for this test: {CRDS} is missing", pytrace=False)
    out = {}
    for path in sorted(CRDS.glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
                schema.setdefault("properties", {})["metadata"] = {"type": "object"}
                out[(f"{group}/{version['name']}", kind)] = strict(schema)
    return out


def validate(obj: dict, tmp_path=None) -> None:
    if obj["kind"] == "EnvoyFilter":  # Istio's: no CRD here; what it inserts is checked by Envoy
        return validate_envoy_filter(obj, tmp_path)
    if obj["kind"] == "EnvoyPatchPolicy":  # its patches' values are Envoy's own config: Envoy checks them
        envoy_validates(*patch_policy_parts(obj), tmp_path)
    schema = crd_schemas().get((obj["apiVersion"], obj["kind"]))
    if schema is not None:
        jsonschema.validate(obj, schema)
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


class EnvoyRejected(Exception):
    pass


def validate_envoy_filter(obj: dict, tmp_path) -> None:
    """Each HTTP filter the EnvoyFilter inserts, on a cluster of the name it gives."""
    for patch in obj["spec"]["configPatches"]:
        assert patch["applyTo"] == "HTTP_FILTER" and patch["patch"]["operation"] in ("INSERT_FIRST", "INSERT_BEFORE")
        inserted = patch["patch"]["value"]
        name = inserted["typed_config"]["grpc_service"]["envoy_grpc"]["cluster_name"]
        envoy_validates(inserted, {"name": name, "type": "STATIC", "connect_timeout": "1s",
                                   "typed_extension_protocol_options": {
                                       "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                                           "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3."
                                                    "HttpProtocolOptions",
                                           "explicit_http_config": {"http2_protocol_options": {}}}},
                                   "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{
                                       "endpoint": {"address": {"socket_address": {
                                           "address": "127.0.0.1", "port_value": 9004}}}}]}]}}, tmp_path)


def envoy_validates(http_filter: dict, cluster: dict, tmp_path) -> None:
    """`envoy --mode validate` of a minimal config: a listener whose connection manager runs
    `http_filter` first, and `cluster` (the one the filter names)."""
    config = {"static_resources": {
        "listeners": [{"name": "gateway", "address": {"socket_address": {"address": "127.0.0.1", "port_value": 1}},
                       "filter_chains": [{"filters": [{
                           "name": "envoy.filters.network.http_connection_manager",
                           "typed_config": {
                               "@type": "type.googleapis.com/envoy.extensions.filters.network."
                                        "http_connection_manager.v3.HttpConnectionManager",
                               "stat_prefix": "gateway", "route_config": {"name": "r", "virtual_hosts": []},
                               "http_filters": [http_filter, {"name": "envoy.filters.http.router", "typed_config": {
                                   "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
                           }}]}]}],
        "clusters": [cluster],
    }}
    path = tmp_path / "envoy-filter.yaml"
    path.write_text(yaml.safe_dump(config))
    out = subprocess.run([find_envoy(), "--mode", "validate", "-c", str(path), "--log-level", "error"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise EnvoyRejected(out.stdout + out.stderr)


@pytest.fixture(scope="module", params=GATEWAYS)
def rendered(request):
    return request.param, kustomize(K8S / "gateways" / request.param)


@pytest.mark.processes
def test_every_object_validates_against_its_schema(rendered, tmp_path):
    name, objects = rendered
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget"} <= kinds
    assert ("InferencePool" in kinds) == (name == "inference-extension")
    assert ("EnvoyExtensionPolicy" in kinds) == (name == "envoy-gateway")
    assert ("EnvoyFilter" in kinds) == (name == "inference-extension")
    assert ({"EnvoyPatchPolicy", "AIGatewayRoute", "AIServiceBackend"} <= kinds) == (name == "ai-gateway")
    assert ("HTTPRoute" in kinds) == (name != "ai-gateway")  # AI Gateway makes its own of its route
    for o in objects:
        validate(o, tmp_path)


@pytest.mark.parametrize("kind, path, wrong", [
    ("HTTPRoute", ["spec", "rules", 0, "matches", 0, "headers", 0], {"type": "Exact", "name": "x", "valeu": "y"}),
    ("InferencePool", ["spec", "targetPorts", 0], {"number": 70000}),
    ("EnvoyExtensionPolicy", ["spec", "extProc", 0, "processingMode", "request", "body"], "Sometimes"),
    ("Deployment", ["spec", "replicas"], "two"),
    ("EnvoyFilter", ["spec", "configPatches", 0, "patch", "value", "typed_config", "processing_mode",
                     "request_body_mode"], "SOMETIMES"),
    ("AIGatewayRoute", ["spec", "rules", 0, "matches", 0, "headers", 0, "type"], "Prefix"),
    ("AIServiceBackend", ["spec", "schema", "name"], "OpenAl"),
    ("EnvoyPatchPolicy", ["spec", "jsonPatches", 0, "operation", "op"], "upsert"),
    ("EnvoyPatchPolicy", ["spec", "jsonPatches", 1, "operation", "value", "typed_config", "processing_mode",
                          "request_body_mode"], "SOMETIMES"),
    ("EnvoyPatchPolicy", ["spec", "jsonPatches", 0, "operation", "value", "type"], "DNS"),
])
@pytest.mark.processes
def test_a_wrong_field_fails_the_check(kind, path, wrong, tmp_path):
    objects = [o for gateway in GATEWAYS for o in kustomize(K8S / "gateways" / gateway)]
    obj = copy.deepcopy(next(o for o in objects if o["kind"] == kind))
    target = obj
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = wrong
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError, EnvoyRejected)):
        validate(obj, tmp_path)


def test_the_routers_config_serves_the_extensions_ports_and_headers(rendered):
    _, objects = rendered
    config = yaml.safe_load(next(o for o in objects if o["kind"] == "ConfigMap")["data"]["router.yaml"])
    from esr_config import parse_config

    server = parse_config(config).server
    assert (server.grpc_port, server.health_port, server.gateway_model_header) == (9004, 9005, "x-gateway-model-name")
    ports = {p["name"]: p["port"] for o in objects if o["kind"] == "Service" for p in o["spec"]["ports"]}
    assert ports["grpc"] == 9004 and ports["grpc-health"] == 9005
