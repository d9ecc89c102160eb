"""A dead router must not take the gateway down, and routing resumes when it is back."""

from __future__ import annotations

import signal

import httpx
import pytest

from devstack import envoy_bootstrap
from devstack.stack import ROOT, Stack, StackPorts

MATH = {"model": "auto", "messages": [{"role": "user", "content": "solve the equation 5x + 2 = 17"}]}


@pytest.fixture(scope="module")
def own_stack(tmp_path_factory, envoy_binary):
    # A private stack: this test kills its router.
    ports = StackPorts.free(envoy_bootstrap.backend_clusters(envoy_bootstrap.load(ROOT / "envoy.yaml")))
    s = Stack(tmp_path_factory.mktemp("router-down"), ports)
    s.start()
    yield s
    s.stop()


def post(stack, body, headers=None):
    return httpx.post(f"{stack.url}/v1/chat/completions", json=body, headers=headers or {}, timeout=10)


def test_traffic_flows_to_default_while_router_is_dead_and_routing_resumes(own_stack):
    assert post(own_stack, MATH).headers["x-mock-backend"] == "math-model"

    own_stack.kill_router(signal.SIGKILL)
    spoof = {"x-selected-model": "math-model"}
    for _ in range(20):
        r = post(own_stack, MATH, spoof)
        assert r.status_code == 200
        # failure_mode_allow: the request goes on unrouted, to the default backend, and a
        # client cannot pick a backend by sending the router's header itself.
        assert r.headers["x-mock-backend"] == "general-model"
        assert r.json()["model"] == "auto"
        assert "x-selected-model" not in r.json()["mock"]["headers"]

    own_stack.start_router()
    r = post(own_stack, MATH)
    assert r.headers["x-mock-backend"] == "math-model"
    assert r.headers["x-semantic-route-reason"] == "matched"
