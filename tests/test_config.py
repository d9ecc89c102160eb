"""Config loading: the shipped file loads; every bad value is rejected with the exact key named."""

from __future__ import annotations

import copy

import pytest
import yaml

from router.config import ConfigError, load_config, parse_config
from tests.conftest import ROOT

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
