"""Deployment files checked by the real tools: kustomize, kubernetes-validate, promtool; the Grafana
dashboard against the metrics the router exports; the Dockerfile against the tree."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from tests.support.stack import ENVOY_FAILOVER_STATS, envoy_series

# Every room's metrics, registered: what the dashboards and alerts may name.
import esr_app.metrics  # noqa: F401
import esr_cache.metrics  # noqa: F401
import esr_extproc.metrics  # noqa: F401
import esr_model.metrics  # noqa: F401
import esr_remote.metrics  # noqa: F401
import filters.metrics  # noqa: F401
import router.metrics  # noqa: F401
from prometheus_client import REGISTRY
from tests.support import ROOT
from tests.support.deploy import K8S, K8S_VERSION, kustomize, tool

# Every check here reads manifests the real kustomize renders.
pytestmark = pytest.mark.processes

@pytest.fixture(scope="module", params=["base", "overlays/cpu", "overlays/gpu", "overlays/node-model", "overlays/refit"])
def rendered(request):
    return request.param, kustomize(K8S / request.param)


def by_kind(objects: list[dict]) -> dict[str, dict]:
    """One object per kind: the gateway's own (`semantic-router`) where an overlay adds another."""
    out: dict[str, dict] = {}
    for o in objects:
        if o["kind"] not in out or o["metadata"]["name"] == "semantic-router":
            out[o["kind"]] = o
    return out


def test_every_object_validates_against_the_kubernetes_schema(rendered):
    _, objects = rendered
    assert {o["kind"] for o in objects} >= {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "NetworkPolicy"}
    for o in objects:
        kubernetes_validate.validate(o, K8S_VERSION, strict=True)


def test_pod_shape_probes_and_selectors(rendered):
    name, objects = rendered
    kinds = by_kind(objects)
    pod = kinds["Deployment"]["spec"]["template"]
    labels = pod["metadata"]["labels"]
    router = next(c for c in pod["spec"]["initContainers"] if c["name"] == "router")
    envoy = next(c for c in pod["spec"]["containers"] if c["name"] == "envoy")
    assert router["restartPolicy"] == "Always"  # native sidecar
    # With the node's model process, a router whose model is away still answers (fallbacks): it
    # stays ready, so it has no readiness probe of its own.
    probes = ("startupProbe", "livenessProbe") + (() if name == "overlays/node-model" else ("readinessProbe",))
    assert name != "overlays/node-model" or "readinessProbe" not in router
    for probe in probes:  # gRPC health, SERVING only when warm,
        # asked from inside the container: the ext_proc port is on loopback, out of kubelet's reach
        assert router[probe]["exec"]["command"][:2] == ["semantic-router", "health"], probe
    assert all(p["containerPort"] != 50051 for p in router["ports"])
    assert envoy["readinessProbe"]["httpGet"]["path"] == "/healthz"
    for c in (router, envoy):
        assert c["resources"]["requests"] and c["resources"]["limits"]
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    for kind in ("PodDisruptionBudget", "Service", "NetworkPolicy"):
        spec = kinds[kind]["spec"]
        selector = spec.get("selector") if kind == "Service" else (spec.get("selector") or spec.get("podSelector"))["matchLabels"]
        assert selector and all(labels.get(k) == v for k, v in selector.items()), kind
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    gpu = router["resources"]["limits"].get("nvidia.com/gpu")
    assert (gpu == 1) if name == "overlays/gpu" else gpu is None


@pytest.mark.processes
def test_node_model_overlay_shares_one_socket_between_the_daemonset_and_the_sidecars():
    kinds = by_kind(kustomize(K8S / "overlays/node-model"))
    model_pod = kinds["DaemonSet"]["spec"]["template"]["spec"]
    router_pod = kinds["Deployment"]["spec"]["template"]["spec"]
    (model,) = model_pod["containers"]
    router = next(c for c in router_pod["initContainers"] if c["name"] == "router")
    socket = model["args"][model["args"].index("--socket") + 1]
    assert router["args"][router["args"].index("--model-socket") + 1] == socket
    for probe in ("startupProbe", "livenessProbe"):  # the model process is healthy once its socket answers
        assert model[probe]["exec"]["command"] == ["semantic-router", "health", "--socket", socket]
    assert "--answering" in router["livenessProbe"]["exec"]["command"]

    def host_dir(pod, container):
        mount = next(m for m in container["volumeMounts"] if socket.startswith(m["mountPath"] + "/"))
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        return volume["hostPath"]["path"], mount["mountPath"]

    assert host_dir(model_pod, model) == host_dir(router_pod, router)
    assert model["securityContext"]["runAsUser"] == router["securityContext"]["runAsUser"]  # may connect
    assert model["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in router["resources"]["limits"]
    assert model["image"].endswith("-cuda") and router["image"].endswith("-cpu")
    # The socket directory is made the model user's before it starts (hostPath creates it root's).
    (init,) = model_pod["initContainers"]
    assert "os.chown(d, 10001, 10001)" in init["command"][-1]
    assert any(m["mountPath"] == socket.rsplit("/", 1)[0] for m in init["volumeMounts"])


def test_only_envoy_reaches_the_router_and_only_monitoring_reaches_metrics(rendered):
    _, objects = rendered
    router_cfg = yaml.safe_load((K8S / "base" / "router.yaml").read_text())
    assert router_cfg["server"]["grpc_host"] == "127.0.0.1"  # Envoy is in the same pod
    assert router_cfg["envoy"]["router_address"] == "127.0.0.1"
    policy = by_kind(objects)["NetworkPolicy"]["spec"]
    rules = {tuple(p["port"] for p in rule["ports"]): rule for rule in policy["ingress"]}
    assert set(rules) == {(8080,), (9090, 9902)}  # nothing admits 50051 (nor Envoy's admin, 9901)
    assert "from" not in rules[(8080,)]  # the gateway is for everyone
    # /metrics and Envoy's stats only for the monitoring namespace, never every pod
    (source,) = rules[(9090, 9902)]["from"]
    assert source["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}
    assert "podSelector" not in source
    # Egress: DNS, and the ports backends (443, 8000, 8080), a remote engine (7997) and a shared
    # cache store (6379) listen on; nothing else leaves the pod.
    egress = {tuple((p["port"], p["protocol"]) for p in rule["ports"]) for rule in policy["egress"]}
    assert ((53, "UDP"), (53, "TCP")) in egress
    assert {port for rule in egress for port, _ in rule} == {53, 443, 8000, 8080, 7997, 6379}


@pytest.mark.processes
def test_configmaps_carry_the_committed_configs():
    objects = kustomize(K8S / "base")
    data = {}
    for o in objects:
        if o["kind"] == "ConfigMap":
            data.update(o["data"])
    assert data["router.yaml"] == (K8S / "base" / "router.yaml").read_text()
    assert data["envoy.yaml"] == (K8S / "base" / "envoy.yaml").read_text()


def test_envoy_drains_before_sigterm_within_the_grace_period(rendered):
    """The preStop runs the drain script shipped in Envoy's ConfigMap against Envoy's own admin
    address; its wait fits the grace period with the router's drain after it
    (tests/integration/test_rollout.py runs the script against a real Envoy)."""
    _, objects = rendered
    kinds = by_kind(objects)
    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    envoy = next(c for c in pod["containers"] if c["name"] == "envoy")
    shell, script, admin, max_wait, settle = envoy["lifecycle"]["preStop"]["exec"]["command"]
    assert shell == "/bin/bash"
    mount = next(m for m in envoy["volumeMounts"] if script.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    envoy_maps = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == volume["configMap"]["name"]]
    (cm,) = envoy_maps
    assert cm["data"][script.rsplit("/", 1)[1]] == (K8S / "base" / "envoy-drain.sh").read_text()
    bootstrap = yaml.safe_load(cm["data"]["envoy.yaml"])["admin"]["address"]["socket_address"]
    assert admin == f"{bootstrap['address']}:{bootstrap['port_value']}"
    args = envoy["args"]
    assert args[args.index("--drain-strategy") + 1] == "immediate"
    assert int(args[args.index("--drain-time-s") + 1]) >= int(max_wait)
    assert int(max_wait) + int(settle) + 20 <= pod["terminationGracePeriodSeconds"]


@pytest.mark.processes
def test_promtool_checks_scrape_config_and_alert_rules():
    promtool = tool("promtool")
    for args in (["check", "config", "deploy/prometheus/prometheus.yml"], ["check", "rules", "deploy/prometheus/alerts.yml"]):
        out = subprocess.run([promtool, *args], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())["groups"][0]["rules"]
    assert {r["alert"] for r in rules} == {
        "SemanticRouterDown", "SemanticRouterFallbackRatioHigh", "SemanticRouterProcessingLatencyHigh",
        "SemanticRouterQueueNearFull", "SemanticRouterRemoteEngineDown", "SemanticRouterEnvoyFailOpen",
        "SemanticRouterExtProcFailing", "SemanticRouterBackendModelEjected"}


@pytest.mark.processes
def test_prometheus_scrapes_the_model_daemonset_and_envoys_own_stats():
    jobs = {j["job_name"]: j for j in yaml.safe_load((ROOT / "deploy/prometheus/kubernetes-scrape-job.yml").read_text())["scrape_configs"]}
    keep = jobs["semantic-router"]["relabel_configs"][0]
    assert re.fullmatch(keep["regex"].split()[0], "semantic-router-model")  # the DaemonSet's pods too
    model_pod = by_kind(kustomize(K8S / "overlays/node-model"))["DaemonSet"]["spec"]["template"]["metadata"]
    assert model_pod["annotations"]["prometheus.io/scrape"] == "true"
    envoy_job = jobs["semantic-router-envoy"]
    assert envoy_job["metrics_path"] == "/stats/prometheus"
    port_rule = next(r for r in envoy_job["relabel_configs"] if r["source_labels"] == ["__meta_kubernetes_pod_container_port_name"])
    pod = by_kind(kustomize(K8S / "base"))["Deployment"]["spec"]["template"]["spec"]
    envoy = next(c for c in pod["containers"] if c["name"] == "envoy")
    (port,) = [p for p in envoy["ports"] if p["name"] == port_rule["regex"]]
    router_cfg = yaml.safe_load((K8S / "base" / "router.yaml").read_text())
    assert port["containerPort"] == router_cfg["envoy"]["stats_port"]


def exported_names() -> set[str]:
    names = set()
    for collector, sample_names in REGISTRY._collector_to_names.items():
        names.update(sample_names)
    return {n for n in names if n.startswith("semantic_router_")}


def promql_metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(semantic_router_[a-z0-9_]+)", expr))


def test_grafana_panels_only_use_exported_metrics():
    dash = json.loads((ROOT / "deploy/grafana/semantic-router.json").read_text())
    exported = exported_names()
    titles = {p["title"] for p in dash["panels"]}
    assert {"Requests by route", "Fallbacks by reason", "Routing latency (ext_proc body to answer)",
            "Batch size distribution", "Queue wait", "Queue depth", "Model inference time per batch",
            "Embedding cache hit ratio (earlier turns, repeated prompts)", "Remote engine calls by outcome (circuit open: refused)"} <= titles
    for panel in dash["panels"]:
        for target in panel["targets"]:
            used, envoys = promql_metric_names(target["expr"]), envoy_series(target["expr"])
            assert used or envoys, (panel["title"], target["expr"])
            assert used <= exported, f"{panel['title']}: {sorted(used - exported)} not exported"
            # Envoy's, as tests/integration/test_failover.py scrapes them from the rendered gateway
            assert envoys <= set(ENVOY_FAILOVER_STATS), f"{panel['title']}: {sorted(envoys - set(ENVOY_FAILOVER_STATS))}"
    for rule in yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())["groups"][0]["rules"]:
        assert promql_metric_names(rule["expr"]) <= exported, rule["alert"]  # `up` is Prometheus' own


@pytest.mark.processes
def test_grafana_sidecar_configmap():
    (cm,) = kustomize(ROOT / "deploy/grafana")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    kubernetes_validate.validate(cm, K8S_VERSION, strict=True)
    assert json.loads(cm["data"]["semantic-router.json"]) == json.loads((ROOT / "deploy/grafana/semantic-router.json").read_text())


def test_dockerfile_copies_only_what_exists_and_pins_match():
    text = (ROOT / "deploy/docker/Dockerfile").read_text()
    copies = re.findall(r"^COPY\s+(.+)$", text, flags=re.M)
    assert copies
    for line in (c for c in copies if not c.startswith("--from=")):  # from a build stage, not the context
        *sources, _dest = line.split()
        for src in sources:
            assert (ROOT / src).exists(), f"Dockerfile copies missing {src}"
    assert "torch==2.13.0" in text and "VARIANT" in text

    def pins(path):
        return dict(line.split()[0].split("==") for line in (ROOT / path).read_text().splitlines()
                    if "==" in line and not line.startswith("#"))

    dev = pins("requirements.lock")
    for lock in ("requirements-runtime.lock", "requirements-torch.lock"):
        assert {k: v for k, v in pins(lock).items() if dev.get(k) != v} == {}, lock


def test_refit_overlay_seeds_a_live_config_that_records_texts_within_bounds(tmp_path):
    from esr_config import load_config

    refit = K8S / "overlays/refit"
    assert "records" not in yaml.safe_load((K8S / "base/router.yaml").read_text())  # appended, never doubled
    seeded = tmp_path / "router.yaml"
    seeded.write_text((K8S / "base/router.yaml").read_text() + (refit / "records.yaml").read_text())
    records = load_config(seeded).records
    assert records.enabled and records.prompts and "{host}" in records.path
    assert records.max_bytes and records.max_age_s <= 86400
    kinds = by_kind(kustomize(refit))
    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["seed-config", "router"]  # the config before the router
    router = pod["initContainers"][1]
    assert router["args"][-1] == "/var/lib/semantic-router/router.yaml"
    job = kinds["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    claims = {v["persistentVolumeClaim"]["claimName"] for v in job["volumes"] + pod["volumes"] if "persistentVolumeClaim" in v}
    assert claims == {kinds["PersistentVolumeClaim"]["metadata"]["name"]}
    assert kinds["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteMany"]


def test_the_refit_script_takes_the_records_gates_and_swaps_the_live_config(tmp_path):
    """refit.sh as the CronJob runs it, on a directory standing for the volume."""
    import json
    import shutil
    import sys
    from tests.support.traffic import prompts

    live = tmp_path / "live"
    (live / "records").mkdir(parents=True)
    shutil.copy(ROOT / "router.yaml", live / "router.yaml")
    def write(path, texts, route="general", last_newline=True):
        lines = [json.dumps({"time": 1.0, "route": route, "model": "general-model", "reason": "matched",
                             "confidence": 0.5, "facts": {"prompt_tokens": 8}, "texts": [t]}) for t in texts]
        path.write_text("\n".join(lines) + ("\n" if last_newline else ""))

    texts = prompts(300, seed=3)
    # Two replicas' files, one rotated (.1) and one cut without its last newline; a killed run's leftovers.
    write(live / "records" / "pod-a.jsonl", texts[:100], last_newline=False)
    write(live / "records" / "pod-a.jsonl.1", texts[100:200])
    write(live / "records" / "pod-b.jsonl", texts[200:])
    (live / "refit" / "run.killed").mkdir(parents=True)
    write(live / "refit" / "run.killed" / "records.jsonl.all", texts[:5])
    env = {**os.environ, "LIVE": str(live), "MAX_CHANGED": "1.0", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    script = K8S / "overlays/refit/refit.sh"
    out = subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "refit swapped in" in out.stdout
    assert not list((live / "records").iterdir())  # taken, the rotated file too
    assert not list(live.glob("refit/*/*.jsonl*"))  # and the texts gone with the run, and the killed run's
    assert "records: 300 replayable" in out.stdout  # every file read, no line lost to a missing newline
    from esr_config import load_config

    swapped = load_config(live / "router.yaml")  # the refit, loadable, its run's files beside it
    assert (live / "router.yaml").read_text() != (ROOT / "router.yaml").read_text()
    assert set(swapped.static_tier.accept) == {"math", "code"}
    # A gate that refuses leaves the live config as it was.
    before = (live / "router.yaml").read_text()
    write(live / "records" / "pod-a.jsonl", prompts(200, seed=4), route="nowhere")
    refused = subprocess.run(["sh", str(script)], env={**env, "MAX_CHANGED": "0.0"}, capture_output=True, text=True,
                             timeout=600)
    assert refused.returncode == 3 and "the replay gate refused" in refused.stdout
    assert (live / "router.yaml").read_text() == before
    assert not list(live.glob("refit/*/*.jsonl*"))  # refused, and the texts gone all the same
