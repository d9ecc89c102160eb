"""`semantic-router envoy-config`: committed Envoy configs match what it renders, and Envoy accepts them."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import yaml

from devstack.envoy_binary import find_envoy
from esr_settings import replace_at
from esr_config import ConfigError, load_config
from esr_extproc.config import BackendConfig
from esr_app.envoy_config import llm_path_regex, message_timeout_ms, render, render_yaml
from tests.support import ROOT

# (router config, the Envoy config committed beside it)
COMMITTED = [
    (ROOT / "router.yaml", ROOT / "envoy.yaml"),
    (ROOT / "deploy/kubernetes/base/router.yaml", ROOT / "deploy/kubernetes/base/envoy.yaml"),
]


def envoy_validate(path) -> None:
    try:
        envoy = find_envoy()
    except FileNotFoundError as exc:
        pytest.fail(f"envoy --mode validate needs Envoy: {exc}", pytrace=False)
    out = subprocess.run([envoy, "--mode", "validate", "-c", str(path), "--log-level", "error"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("router_cfg, envoy_cfg", COMMITTED, ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_envoy_config_matches_render(router_cfg, envoy_cfg):
    rendered = render_yaml(load_config(router_cfg))
    assert envoy_cfg.read_text() == rendered, (
        f"{envoy_cfg.relative_to(ROOT)} drifted from its router config; re-render with\n"
        f"  semantic-router envoy-config --config {router_cfg.relative_to(ROOT)} --out {envoy_cfg.relative_to(ROOT)}")


@pytest.mark.processes
@pytest.mark.parametrize("router_cfg, envoy_cfg", COMMITTED, ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_envoy_configs_validate(router_cfg, envoy_cfg):
    envoy_validate(envoy_cfg)


@pytest.mark.processes
def test_tls_dns_backends_and_derived_timeouts_validate(tmp_path):
    cfg = load_config(ROOT / "router.yaml")
    cfg = dataclasses.replace(
        cfg,
        server=dataclasses.replace(cfg.server, deadline_ms=200),
        backends=(
            BackendConfig(model="general-model", address="api.example.internal", port=443, tls=True),
            BackendConfig(model="math-model", address="10.0.0.7", port=8000),
            BackendConfig(model="code-model", address="code.svc.cluster.local", port=8000),
        ),
    )
    doc = render(cfg)
    ext_proc = http_filters(doc)["envoy.filters.http.ext_proc"]
    assert ext_proc["typed_config"]["failure_mode_allow"] is True
    assert ext_proc["typed_config"]["message_timeout"] == f"{message_timeout_ms(cfg) / 1000:.3f}s"
    assert message_timeout_ms(cfg) > cfg.server.deadline_ms
    clusters = {c["name"]: c for c in doc["static_resources"]["clusters"]}
    assert clusters["general-model"]["type"] == "STRICT_DNS"
    tls = clusters["general-model"]["transport_socket"]["typed_config"]
    assert tls["sni"] == "api.example.internal"
    assert tls["common_tls_context"]["validation_context"] == {  # verified: the system's CAs, the SNI's name
        "trusted_ca": {"filename": "/etc/ssl/certs/ca-certificates.crt"},
        "match_typed_subject_alt_names": [{"san_type": "DNS", "matcher": {"exact": "api.example.internal"}}]}
    assert clusters["math-model"]["type"] == "STATIC" and "transport_socket" not in clusters["math-model"]
    path = tmp_path / "envoy.yaml"
    path.write_text(render_yaml(cfg))
    envoy_validate(path)


def http_filters(doc) -> dict:
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    return {f["name"]: f for f in hcm["http_filters"]}


@pytest.mark.processes
def test_the_edge_trusts_no_client_address_and_refuses_other_paths(tmp_path):
    cfg = load_config(ROOT / "router.yaml")
    cfg = replace_at(cfg, "envoy", trusted_hops=1, passthrough_paths=("/v1/models",))
    doc = render(cfg)
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["use_remote_address"] is True and hcm["xff_num_trusted_hops"] == 1
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    assert routes[-1]["direct_response"]["status"] == 404 and routes[-1]["match"] == {"prefix": "/"}
    assert routes[-2]["match"] == {"prefix": "/v1/models"} and routes[-2]["route"]["cluster"] == "general-model"
    path = tmp_path / "envoy.yaml"
    path.write_text(render_yaml(cfg))
    envoy_validate(path)


@pytest.mark.parametrize("path, routed", [
    ("/v1/chat/completions", True), ("/V1/Chat/Completions/", True), ("/openai/v1/messages", True),
    ("/v1/responses;x=1", True), ("/v1/completions%3Bx", True), ("/v1/embeddings", False),
    ("/invocations", False), ("/api/chat", False), ("/generate", False), ("/v1/chat/completions/x", False),
])
def test_llm_path_regex(path, routed):
    import re
    assert bool(re.fullmatch(llm_path_regex().removeprefix("(?i)"), path, re.I)) is routed


@pytest.mark.processes
def test_cli_backend_flags_and_errors(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "esr_app", "envoy-config", "--config", str(ROOT / "router.yaml"),
         "--backend", "math-model=math.example.com:443:tls", "--listen-port", "18080"],
        capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    doc = yaml.safe_load(out.stdout)
    clusters = {c["name"]: c for c in doc["static_resources"]["clusters"]}
    assert clusters["math-model"]["transport_socket"]["typed_config"]["sni"] == "math.example.com"
    assert doc["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"] == 18080
    bad = subprocess.run([sys.executable, "-m", "esr_app", "envoy-config", "--config", str(ROOT / "router.yaml"),
                          "--backend", "nonsense"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and "MODEL=HOST:PORT" in bad.stderr


@pytest.mark.processes
def test_cli_backend_flags_take_ipv6_literals_and_sni():
    out = subprocess.run(
        [sys.executable, "-m", "esr_app", "envoy-config", "--config", str(ROOT / "router.yaml"),
         "--backend", "math-model=[::1]:8001",
         "--backend", "general-model=[2001:db8::7]:443:tls=api.example.com",
         "--backend", "code-model=10.0.0.5:443:tls"],
        capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    doc = yaml.safe_load(out.stdout)
    clusters = {c["name"]: c for c in doc["static_resources"]["clusters"]}

    def socket(name):
        return clusters[name]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]

    assert socket("math-model") == {"address": "::1", "port_value": 8001}
    assert clusters["math-model"]["type"] == "STATIC"
    assert socket("general-model") == {"address": "2001:db8::7", "port_value": 443}
    assert clusters["general-model"]["transport_socket"]["typed_config"]["sni"] == "api.example.com"
    assert clusters["code-model"]["transport_socket"]["typed_config"]["sni"] == "10.0.0.5"
    for bad in ("math-model=::1:8001", "math-model=[::1]", "math-model=host:443:tls=", "math-model=[zz]:80", "math-model=[fffff]:80"):
        run = subprocess.run([sys.executable, "-m", "esr_app", "envoy-config", "--config", str(ROOT / "router.yaml"),
                              "--backend", bad], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert run.returncode == 2 and "MODEL=HOST:PORT" in run.stderr, bad


@pytest.mark.processes
def test_with_the_cache_the_keeper_runs_before_the_router_and_the_tenant_header_is_envoys(tmp_path):
    cfg = load_config(ROOT / "router.yaml")
    cfg = dataclasses.replace(cfg, cache=dataclasses.replace(cfg.cache, enabled=True, tenant_header="x-tenant"))
    rendered = render(cfg)
    hcm = rendered["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    names = [f["name"] for f in hcm["http_filters"]]
    assert names.index("envoy.filters.http.lua") < names.index("envoy.filters.http.ext_proc")
    assert {"x-tenant", "x-semantic-cache-keeper"} <= set(hcm["route_config"]["internal_only_headers"])
    path = tmp_path / "envoy.yaml"
    path.write_text(render_yaml(cfg))
    envoy_validate(path)


@pytest.mark.processes
def test_full_duplex_bodies_render_as_the_inference_extension_configures_them(tmp_path):
    cfg = load_config(ROOT / "router.yaml")
    cfg = dataclasses.replace(cfg, envoy=dataclasses.replace(cfg.envoy, request_body_mode="full_duplex_streamed"))
    hcm = render(cfg)["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    ext_proc = next(f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc")["typed_config"]
    assert ext_proc["processing_mode"]["request_body_mode"] == "FULL_DUPLEX_STREAMED"
    assert ext_proc["processing_mode"]["request_trailer_mode"] == "SEND"
    assert ext_proc["failure_mode_allow"] is False and ext_proc["allow_mode_override"] is True
    path = tmp_path / "envoy.yaml"
    path.write_text(render_yaml(cfg))
    envoy_validate(path)


def _ranked(tmp_path, **failover):
    source = yaml.safe_load((ROOT / "router.yaml").read_text())
    source["routes"][0]["models"] = ["math-model", "general-model"]
    source["routes"][1].update(models=["code-model", "math-model", "general-model"], header_timeout_ms=2000)
    for route in source["routes"]:
        route.pop("model")
    source["failover"] = failover
    (tmp_path / "ranked.yaml").write_text(yaml.safe_dump(source))
    return load_config(tmp_path / "ranked.yaml")


@pytest.mark.processes
def test_ranked_models_render_a_failover_cluster_and_route_per_chain_the_router_may_name(tmp_path):
    doc = render(_ranked(tmp_path))
    clusters = {c["name"]: c for c in doc["static_resources"]["clusters"]}
    failover = {n: c for n, c in clusters.items() if n.startswith("failover:")}
    # every ordered subset of two or more of a route's models (the capable ones of a request)
    assert set(failover) == {"failover:math-model,general-model", "failover:code-model,math-model,general-model",
                             "failover:code-model,math-model", "failover:code-model,general-model"}
    assert failover["failover:code-model,general-model"]["cluster_type"]["typed_config"]["clusters"] == \
        ["code-model", "general-model"]
    budget = failover["failover:code-model,general-model"]["circuit_breakers"]["thresholds"][0]["retry_budget"]
    assert budget["budget_percent"]["value"] == 100.0  # not Envoy's 3 retries in flight
    names = [f["name"] for f in failover["failover:code-model,general-model"]["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]["http_filters"]]
    assert names == ["envoy.filters.http.header_mutation", "envoy.filters.http.lua", "envoy.filters.http.upstream_codec"]
    backend = clusters["math-model"]
    assert backend["outlier_detection"]["consecutive_5xx"] == 5
    assert backend["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["metadata"] == \
        {"filter_metadata": {"semantic_router": {"model": "math-model"}}}
    routes = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"][
        "route_config"]["virtual_hosts"][0]["routes"]
    chained = [r for r in routes if r.get("route", {}).get("cluster", "").startswith("failover:")]
    # a route with its own header timeout matches its name; the routes of the defaults share theirs ("*")
    by_route = {(h[1]["string_match"]["exact"] if len(h) > 1 else "*", h[0]["string_match"]["exact"]): r["route"]
                for r in chained for h in [r["match"]["headers"]]}
    assert set(by_route) == {("*", "math-model,general-model"), ("code", "code-model,math-model,general-model"),
                             ("code", "code-model,math-model"), ("code", "code-model,general-model"),
                             ("code", "math-model,general-model")}
    assert list(by_route)[-1] == ("*", "math-model,general-model")  # after every route's own
    code = by_route[("code", "code-model,math-model,general-model")]["retry_policy"]
    assert code["num_retries"] == 2 and code["per_try_timeout"] == "2.000s"
    assert code["retriable_status_codes"] == [429, 500, 502, 503]
    assert "per_try_timeout" not in by_route[("*", "math-model,general-model")]["retry_policy"]
    assert routes.index(chained[-1]) < min(i for i, r in enumerate(routes) if r.get("route", {}).get("cluster") == "math-model")
    # every failed try goes to the router's access-log service, with its endpoint's model
    (log,) = http_filters(doc)["envoy.filters.http.router"]["typed_config"]["upstream_log"]
    common = log["typed_config"]["common_config"]
    assert common["grpc_service"]["envoy_grpc"]["cluster_name"] == "semantic_router"
    assert common["custom_tags"][0]["metadata"]["metadata_key"] == {"key": "semantic_router", "path": [{"key": "model"}]}
    path = tmp_path / "envoy.yaml"
    path.write_text(render_yaml(_ranked(tmp_path)))
    envoy_validate(path)


@pytest.mark.processes
def test_with_selection_every_order_is_a_chain_and_routes_that_fail_over_alike_share_one(tmp_path):
    _ranked(tmp_path)
    source = yaml.safe_load((tmp_path / "ranked.yaml").read_text())
    source["routes"][0].update(header_timeout_ms=2000)  # math now fails over as code does
    source["selection"] = {"path": str(tmp_path / "q.npz"), "prices": {}, "feedback": {"enabled": True}}
    (tmp_path / "selected.yaml").write_text(yaml.safe_dump(source))
    routes = render(load_config(tmp_path / "selected.yaml"))["static_resources"]["listeners"][0]["filter_chains"][0][
        "filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    plain = [r for r in routes if r.get("route", {}).get("cluster", "").startswith("failover:")
             and not any(h["name"] == "x-semantic-selection-id" for h in r["match"]["headers"])]
    chained = {r["match"]["headers"][0]["string_match"]["exact"]: r["match"]["headers"][1:] for r in plain}
    for r in plain:  # with feedback, each chain's twin just before it names the model that answered
        twin = routes[routes.index(r) - 1]
        assert twin["match"]["headers"] == r["match"]["headers"] + [{"name": "x-semantic-selection-id", "present_match": True}]
        assert twin["response_headers_to_add"][-1]["header"]["value"] == \
            "%REQ(x-semantic-selection-id)%~%UPSTREAM_METADATA(semantic_router:model)%"
    # the routes of what the router did not decide keep their stats' name
    undecided = [r for r in routes if r["match"].get("safe_regex") and "headers" not in r["match"]]
    assert len(undecided) > 1 and all(r.get("stat_prefix") == "semantic_router_undecided" for r in undecided)
    assert not [r for r in routes if r.get("stat_prefix") and "headers" in r["match"]]
    path = tmp_path / "envoy.yaml"
    path.write_text(render_yaml(load_config(tmp_path / "selected.yaml")))
    envoy_validate(path)
    # selection may put general-model first: its order is a chain too
    assert {"general-model,math-model", "math-model,general-model", "general-model,code-model,math-model"} <= set(chained)
    both = {"string_match": {"safe_regex": {"regex": "math|code"}}, "name": "x-semantic-route"}
    assert chained["general-model,math-model"] == [both]  # one route for both, by name
    assert chained["general-model,code-model"] == [{"name": "x-semantic-route", "string_match": {"exact": "code"}}]
    assert len(chained) == 6 + 6  # code's 3·2 pairs and 3! triples; math's 2 pairs among them, shared


def test_a_timed_out_try_runs_again_only_on_an_idempotent_route(tmp_path):
    def policies(config):
        routes = render(config)["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
            "typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
        return [r["route"]["retry_policy"] for r in routes if "retry_policy" in r.get("route", {})]

    # Envoy retries a per-try timeout (a local reset) under reset, 5xx or gateway-error; a model's
    # own 504 is a timeout too
    for policy in policies(_ranked(tmp_path)):
        assert not {"5xx", "gateway-error", "reset"} & set(policy["retry_on"].split(","))
        assert 504 not in policy["retriable_status_codes"] and 503 in policy["retriable_status_codes"]
        assert {"connect-failure", "reset-before-request"} <= set(policy["retry_on"].split(","))
    source = yaml.safe_load((tmp_path / "ranked.yaml").read_text())
    source["routes"][1]["idempotent"] = True
    (tmp_path / "idempotent.yaml").write_text(yaml.safe_dump(source))
    code = [p for p in policies(load_config(tmp_path / "idempotent.yaml")) if p.get("per_try_timeout") == "2.000s"]
    assert code and all({"5xx", "reset"} <= set(p["retry_on"].split(",")) and 504 in p["retriable_status_codes"]
                        for p in code)


def test_only_a_models_own_answers_eject_it_and_a_health_check_finds_one_that_is_down(tmp_path):
    clusters = {c["name"]: c for c in render(_ranked(tmp_path))["static_resources"]["clusters"]}
    outlier = clusters["code-model"]["outlier_detection"]
    # timeouts and resets are local-origin: split off, and they eject no one
    assert outlier["split_external_local_origin_errors"] is True
    assert outlier["enforcing_consecutive_local_origin_failure"] == 0
    (check,) = clusters["code-model"]["health_checks"]
    assert check["http_health_check"]["path"] == "/v1/models" and check["interval"] == "2s"
    assert check["http_health_check"]["expected_statuses"] == [{"start": 100, "end": 500}]
    quiet = {c["name"]: c for c in render(_ranked(tmp_path, health_interval_s=0))["static_resources"]["clusters"]}
    assert "health_checks" not in quiet["code-model"]
    with pytest.raises(ConfigError, match="failover.health_path"):
        _ranked(tmp_path, health_path="v1/models")


def test_max_attempts_bounds_the_chains_and_one_renders_none(tmp_path):
    two = {c["name"] for c in render(_ranked(tmp_path, max_attempts=2))["static_resources"]["clusters"]}
    assert "failover:code-model,math-model,general-model" not in two and "failover:code-model,general-model" in two
    one = render(_ranked(tmp_path, max_attempts=1, eject_after=0))["static_resources"]["clusters"]
    assert not [c for c in one if c["name"].startswith("failover:")]
    assert not [c for c in one if "outlier_detection" in c]


def test_in_full_duplex_envoy_holds_a_body_it_may_retry_whole(tmp_path):
    """Envoy retries only a request it holds whole (rq_retry_skipped_request_not_complete): with
    failover chains, full duplex gets the buffer filter between the router's filter and Envoy's router."""
    cfg = _ranked(tmp_path)
    duplex = replace_at(cfg, "envoy.request_body_mode", "full_duplex_streamed")
    assert list(http_filters(render(duplex)))[-3:] == [
        "envoy.filters.http.ext_proc", "envoy.filters.http.buffer", "envoy.filters.http.router"]
    assert "envoy.filters.http.buffer" not in http_filters(render(cfg))  # buffered: Envoy holds it already
    single = replace_at(load_config(ROOT / "router.yaml"), "envoy.request_body_mode", "full_duplex_streamed")
    assert "envoy.filters.http.buffer" not in http_filters(render(single))  # nothing to retry


@pytest.mark.processes
def test_the_failover_example_renders_a_config_envoy_accepts(tmp_path):
    path = tmp_path / "envoy.yaml"
    path.write_text(render_yaml(load_config(ROOT / "examples/failover/router.yaml")))
    envoy_validate(path)


def test_the_feedback_path_is_the_routers_to_answer_before_any_passthrough(tmp_path):
    raw = yaml.safe_load((ROOT / "router.yaml").read_text())
    raw["selection"] = {"path": str(tmp_path / "q.npz"), "feedback": {"enabled": True, "path": "/scores"}}
    raw.setdefault("envoy", {})["passthrough_paths"] = ["/"]  # would take every path, scores too
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    routes = render(load_config(tmp_path / "c.yaml"))["static_resources"]["listeners"][0]["filter_chains"][0][
        "filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    at = next(i for i, r in enumerate(routes) if r["match"].get("path") == "/scores")
    passthrough = next(i for i, r in enumerate(routes) if r["match"].get("prefix") == "/" and "route" in r)
    assert at < passthrough
    feedback = routes[at]
    assert "typed_per_filter_config" not in feedback  # ext_proc runs: the router answers it
    assert feedback["direct_response"]["status"] == 503  # only where the router did not
