"""What a reload takes from the file (esr_app/reload.py): the routes and what names them, never the
sections that shape the model, the sockets or the cache's store."""

from __future__ import annotations

import asyncio

import yaml

from esr_app.reload import ConfigReloader
from esr_config import load_config
from tests.support import ROOT


def _reload(tmp_path, running: dict, edited: dict):
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(running))
    applied = []

    async def apply(config, swap_model):
        applied.append(config)

    reloader = ConfigReloader(path, load_config(path), apply, can_swap_model=False)
    path.write_text(yaml.safe_dump(edited))
    ok = asyncio.run(reloader.reload("test"))
    return ok, applied


def _base() -> dict:
    cfg = yaml.safe_load((ROOT / "router.yaml").read_text())
    cfg["cache"] = {"enabled": True, "semantic_routes": ["math"], "semantic_thresholds": {"code": 0.9}}
    return cfg


def test_a_reload_removing_a_route_and_its_mentions_is_taken(tmp_path):
    running, edited = _base(), _base()
    model = next(r["model"] for r in edited["routes"] if r["name"] == "math")
    edited["routes"] = [r for r in edited["routes"] if r["name"] != "math"]
    edited["backends"] = [b for b in edited.get("backends", []) if b["model"] != model]
    edited["cache"] = {"enabled": True, "semantic_routes": [], "semantic_thresholds": {"code": 0.8}}
    edited["static_tier"] = {key: {k: v for k, v in table.items() if k != "math"}
                             for key, table in edited["static_tier"].items()}
    ok, applied = _reload(tmp_path, running, edited)
    assert ok
    new = applied[-1]
    assert "math" not in new.route_names
    assert new.cache.semantic_routes == () and new.cache.semantic_thresholds == {"code": 0.8}


def test_a_reload_keeps_the_cache_store_and_takes_its_matching_policy(tmp_path):
    running, edited = _base(), _base()
    edited["cache"] = {**edited["cache"], "max_bytes": 2 * 1024 * 1024, "semantic_threshold": 0.6}
    ok, applied = _reload(tmp_path, running, edited)
    assert ok
    new = applied[-1]
    assert new.cache.max_bytes == load_config_cache_default_max_bytes()  # the store needs a restart
    assert new.cache.semantic_threshold == 0.6


def test_a_reload_that_names_a_missing_route_in_the_cache_is_refused(tmp_path):
    running, edited = _base(), _base()
    edited["cache"] = {**edited["cache"], "semantic_routes": ["nowhere"]}
    ok, applied = _reload(tmp_path, running, edited)
    assert not ok and not applied


def load_config_cache_default_max_bytes() -> int:
    from esr_cache.config import CacheConfig
    return CacheConfig().max_bytes
