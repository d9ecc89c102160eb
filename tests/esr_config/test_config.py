"""Config loading: the shipped file loads; every bad value is rejected with the exact key named."""

from __future__ import annotations

import copy

import pytest
import yaml

from esr_config import ConfigError, load_config, parse_config, write_config
from esr_settings import build, replace_at
from tests.support import ROOT

BASE = {
    "routes": [{"name": "math", "model": "math-model", "utterances": ["solve 3x + 5 = 20"], "threshold": 0.5}],
    "default_route": {"name": "general", "model": "general-model"},
}


def with_change(path, value):
    data = copy.deepcopy(BASE)
    node = data
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})
    node[keys[-1]] = value
    return data


def test_shipped_config_loads_with_required_routes():
    cfg = load_config(ROOT / "router.yaml")
    names = {r.name for r in cfg.routes}
    assert {"math", "code"} <= names
    assert cfg.default_route.name == "general"
    assert cfg.encoder.model == "bundled:all-MiniLM-L6-v2"
    assert cfg.backend_models == {"math-model", "code-model", "general-model"}


def test_minimal_config_gets_defaults():
    cfg = parse_config(BASE)
    assert cfg.encoder.device == "auto"
    assert cfg.server.deadline_ms > 0
    assert cfg.threshold_of(cfg.routes[0]) == 0.5


@pytest.mark.parametrize(
    "path, value, key",
    [
        ("routes.0.threshold", "high", "routes[0].threshold"),
        ("routes.0.threshold", 3, "routes[0].threshold"),
        ("default_threshold", 1.5, "default_threshold"),
        ("conversation.gate", 2, "conversation.gate"),
        ("classifier.head_score", "logit", "classifier.head_score"),
        ("routes.0.utterances", [], "routes[0].utterances"),
        ("routes.0.utterances", "solve", "routes[0].utterances"),
        ("routes.0.colour", "red", "routes[0].colour"),
        ("routes.0.model", "bad model\n", "routes[0].model"),
        ("encoder.device", "tpu", "encoder.device"),
        ("server.grpc_port", 70000, "server.grpc_port"),
        ("server.deadline_ms", 0, "server.deadline_ms"),
        ("requests.unknown_model", "ignore", "requests.unknown_model"),
        ("batching.max_batch_size", 0, "batching.max_batch_size"),
        ("cache_size", -1, "cache_size"),
        ("nonsense", 1, "nonsense"),
    ],
)
def test_bad_values_name_their_key(path, value, key):
    with pytest.raises(ConfigError) as err:
        parse_config(with_change(path, value))
    assert f"{key}:" in str(err.value)


def test_energy_thresholds_are_not_bounded_by_one():
    data = with_change("classifier", {"method": "head", "head_score": "energy"})
    data["routes"][0]["threshold"] = 7.5
    data["conversation"] = {"gate": 8.25}
    cfg = parse_config(data)
    assert (cfg.routes[0].threshold, cfg.conversation.gate) == (7.5, 8.25)


def test_missing_required_keys_are_named():
    with pytest.raises(ConfigError, match="default_route: required key is missing"):
        parse_config({"routes": BASE["routes"]})
    with pytest.raises(ConfigError, match=r"routes\[0\].model: required key is missing"):
        parse_config({**BASE, "routes": [{"name": "x", "utterances": ["a"]}]})


def test_duplicate_route_names_rejected():
    data = copy.deepcopy(BASE)
    data["routes"].append(dict(data["routes"][0]))
    with pytest.raises(ConfigError, match=r"routes\[1\].name: duplicate route name 'math'"):
        parse_config(data)


def test_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("routes: [unclosed")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(with_change("routes.0.threshold", "x")))
    with pytest.raises(ConfigError, match=r"good.yaml: routes\[0\].threshold"):
        load_config(good)


FULL = {
    **BASE,
    "encoder": {"model": "bundled:all-MiniLM-L6-v2", "device": "cpu", "backend": "onnx", "precision": "int8",
                "remote": {"url": "https://engine.example:7997", "model": "m", "api_key_env": "KEY"}},
    "classifier": {"method": "head", "head_score": "energy", "head_path": "router.head.npz"},
    "default_threshold": 3.5,
    "conversation": {"policy": "last_turns", "max_turns": 4, "gate": 2.0},
    "requests": {"prompt_turns": 3, "include_system": True, "truncate": "tail", "harness_tags": ["system-reminder"]},
    "rules": [{"when": {"has_tools": True, "min_prompt_tokens": 10}, "route": "math"}],
    "calibration": {"matched": [0.1, 2.0, 3.0, -1.0], "default": [0.5], "fallback": 0.2, "examples": 100},
    "backends": [{"model": "math-model", "address": "10.0.0.1", "port": 8000, "tls": True, "sni": "math.internal"}],
    "envoy": {"trusted_hops": 1, "passthrough_paths": ["/v1/models"], "stats_port": 9902},
    "server": {"workers": "auto", "deadline_ms": 250.0},
    "batching": {"max_batch_size": 32},
    "filters": ["prompt_guard", "model_policy", "semantic_route"],
    "filter_settings": {"prompt_guard": {"threshold": 0.8, "head": {"weights": [0.1, 0.2], "bias": -1.0}}},
    "cache_size": 0,
    "min_confidence": 0.3,
}


@pytest.mark.parametrize("data", [BASE, FULL], ids=["minimal", "every_section"])
def test_write_config_is_the_inverse_of_load_config(data, tmp_path):
    """What fit writes is read back as the config it wrote: every section, the paths beside the
    file (relative on disk, resolved on load), keys at their defaults left out of the file."""
    (tmp_path / "router.head.npz").write_bytes(b"")
    (tmp_path / "source.yaml").write_text(yaml.safe_dump(data))
    loaded = load_config(tmp_path / "source.yaml")
    write_config(loaded, tmp_path / "written.yaml", header="# credit line\n")
    text = (tmp_path / "written.yaml").read_text()
    assert load_config(tmp_path / "written.yaml") == loaded
    assert text.startswith("# credit line\n")
    on_disk = yaml.safe_load(text)
    assert on_disk.get("classifier", {}).get("head_path", "router.head.npz") == "router.head.npz"
    assert "batching" not in on_disk or on_disk["batching"] == {"max_batch_size": 32}  # defaults left out
    assert set(on_disk) <= set(data)


def test_replace_at_copies_every_dataclass_on_the_way():
    cfg = parse_config(FULL)
    changed = replace_at(cfg, "encoder.remote.timeout_ms", 50.0)
    assert changed.encoder.remote.timeout_ms == 50.0 and cfg.encoder.remote.timeout_ms == 1000.0
    assert replace_at(cfg, "server", deadline_ms=99.0).server.deadline_ms == 99.0
    with pytest.raises(ConfigError, match="classifier.top_k"):
        build(type(cfg), {**FULL, "classifier": {"top_k": 0}}, "")
