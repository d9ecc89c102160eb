"""Envoy configured as each gateway configures it, from the shipped manifests: the ext_proc filter
an EnvoyExtensionPolicy becomes (Envoy Gateway's translation of its fields), the filter and
cluster an EnvoyPatchPolicy inserts, and AI Gateway's model extraction in front of its routes."""

from __future__ import annotations

import copy
from typing import Callable

from esr_app.envoy_config import ROUTER_CLUSTER
from esr_extproc.headers import DECIDED_NAMESPACE, SELECTED_MODEL
from tests.support.deploy import K8S, kustomize

EXT_PROC = "envoy.filters.http.ext_proc"
_BODY_MODES = {"Buffered": "BUFFERED", "Streamed": "STREAMED", "FullDuplexStreamed": "FULL_DUPLEX_STREAMED",
               "BufferedPartial": "BUFFERED_PARTIAL"}


def manifest(gateway: str, kind: str) -> dict:
    """The first object of `kind` in deploy/kubernetes/gateways/<gateway>, as kustomize renders it."""
    return next(o for o in kustomize(K8S / "gateways" / gateway) if o["kind"] == kind)


def on_router_cluster(ext_proc: dict) -> dict:
    """A copy of an ext_proc filter that reaches the stack's router (the manifests name the Service's)."""
    ext_proc = copy.deepcopy(ext_proc)
    ext_proc["typed_config"]["grpc_service"]["envoy_grpc"]["cluster_name"] = ROUTER_CLUSTER
    return ext_proc


def extension_policy_filter(policy: dict, body_mode: str | None = None) -> dict:
    """The ext_proc filter Envoy Gateway makes of the policy's first extProc (`body_mode`: another
    of its processingMode.request.body values), on the stack's router cluster."""
    ext = policy["spec"]["extProc"][0]
    mode = ext.get("processingMode", {})
    body = _BODY_MODES[body_mode or mode.get("request", {}).get("body", "Buffered")]
    duplex = body == "FULL_DUPLEX_STREAMED"
    return {"name": f"{EXT_PROC}/envoyextensionpolicy/default/{policy['metadata']['name']}/extproc/0",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
                "grpc_service": {"envoy_grpc": {"cluster_name": ROUTER_CLUSTER}, "timeout": "10s"},
                "failure_mode_allow": bool(ext.get("failOpen", False)) and not duplex,
                "message_timeout": ext.get("messageTimeout", "0.2s"),
                "allow_mode_override": bool(mode.get("allowModeOverride", False)),
                "processing_mode": {
                    "request_header_mode": "SEND" if "request" in mode else "SKIP",
                    "request_body_mode": body,
                    # Envoy takes full duplex only with the trailers that may end the body.
                    "request_trailer_mode": "SEND" if duplex else "SKIP",
                    "response_header_mode": "SKIP", "response_body_mode": "NONE", "response_trailer_mode": "SKIP",
                }}}


def envoy_filter_inserted(envoy_filter: dict) -> dict:
    """The HTTP filter an Istio EnvoyFilter inserts, on the stack's router cluster."""
    (patch,) = envoy_filter["spec"]["configPatches"]
    return on_router_cluster(patch["patch"]["value"])


def patch_policy_parts(policy: dict) -> tuple[dict, dict]:
    """(the HTTP filter, the cluster) an EnvoyPatchPolicy adds."""
    filters = [p["operation"]["value"] for p in policy["spec"]["jsonPatches"] if p["type"].endswith("Listener")]
    clusters = [p["operation"]["value"] for p in policy["spec"]["jsonPatches"] if p["type"].endswith("Cluster")]
    assert len(filters) == len(clusters) == 1, policy
    return copy.deepcopy(filters[0]), copy.deepcopy(clusters[0])


def http_filters_of(listener: dict) -> list[dict]:
    """The listener's HTTP filters, where it runs the router's (else none)."""
    chain = listener["filter_chains"][0]["filters"][0]["typed_config"].get("http_filters", [])
    return chain if any(f["name"] == EXT_PROC for f in chain) else []


def http_filters(envoy: dict) -> list[dict]:
    """The gateway listener's HTTP filters (the one the router's filter is in)."""
    return next(c for c in map(http_filters_of, envoy["static_resources"]["listeners"]) if c)


JSON_TO_METADATA = "envoy.filters.http.json_to_metadata"


def in_place_of_the_routers_filter(*filters: dict) -> Callable[[dict], None]:
    """An envoy_patch: the rendered router filter's place taken by `filters` (the gateway's own),
    and the rendered config's own reading of the body's model gone, as are its routes' match on the
    router's mark (a gateway's HTTPRoutes match headers alone: docs/gateways/README.md#undecided-requests)."""
    def patch(envoy: dict) -> None:
        for route in _routes(envoy):
            route["match"]["dynamic_metadata"] = [m for m in route["match"].get("dynamic_metadata", [])
                                                  if m["filter"] != DECIDED_NAMESPACE]
            if not route["match"]["dynamic_metadata"]:
                del route["match"]["dynamic_metadata"]
        chain = http_filters(envoy)
        chain[:] = [f for f in chain if f["name"] != JSON_TO_METADATA]
        at = next(i for i, f in enumerate(chain) if f["name"] == EXT_PROC)
        chain[at:at + 1] = [copy.deepcopy(f) for f in filters]
    return patch


# AI Gateway's ext_proc, as far as routing goes: the (buffered) body's `model` into x-ai-eg-model,
# then the route picked again. Its own binary is not available here; this is what its rules see.
_AI_GATEWAY_LUA = """
function envoy_on_request(handle)
  local body = handle:body()
  local model = body and body:getBytes(0, body:length()):match('"model"%s*:%s*"([^"]*)"')
  if model then
    handle:headers():replace("x-ai-eg-model", model)
    handle:clearRouteCache()
  end
end
"""

AI_GATEWAY_MODEL_EXTRACTION = {"name": "ai-gateway-model-extraction", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
    "default_source_code": {"inline_string": _AI_GATEWAY_LUA}}}


AI_GATEWAY_MODEL = "x-ai-eg-model"


def _routes(envoy: dict) -> list[dict]:
    listener = next(x for x in envoy["static_resources"]["listeners"] if http_filters_of(x))
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return [r for vh in hcm["route_config"]["virtual_hosts"] for r in vh["routes"]]


def ai_gateway_patch() -> Callable[[dict], None]:
    """The router's filter from the shipped EnvoyPatchPolicy, first, then AI Gateway's model
    extraction, on the stack's router cluster (the policy's cluster is checked by Envoy elsewhere);
    the routes match x-ai-eg-model for each model the AIGatewayRoute's rules name."""
    inserted = on_router_cluster(patch_policy_parts(manifest("ai-gateway", "EnvoyPatchPolicy"))[0])
    ruled = {h["value"] for rule in manifest("ai-gateway", "AIGatewayRoute")["spec"]["rules"]
             for m in rule["matches"] for h in m["headers"] if h["name"] == AI_GATEWAY_MODEL}
    filters = in_place_of_the_routers_filter(inserted, AI_GATEWAY_MODEL_EXTRACTION)

    def patch(envoy: dict) -> None:
        matched = set()
        for route in _routes(envoy):
            for header in route["match"].get("headers", []):
                if header["name"] == SELECTED_MODEL:
                    header["name"] = AI_GATEWAY_MODEL
                    matched.add(header["string_match"]["exact"])
        assert matched == ruled, f"the AIGatewayRoute rules name {sorted(ruled)}, the backends {sorted(matched)}"
        filters(envoy)
    return patch
