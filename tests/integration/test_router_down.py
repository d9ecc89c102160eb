"""A dead router must not take the gateway down, and routing resumes when it is back."""

from __future__ import annotations

import signal
import time

import httpx
import pytest

from devstack.stack import Stack, StackPorts
from devstack.supervisor import RouterSupervisor

MATH = {"model": "auto", "messages": [{"role": "user", "content": "solve the equation 5x + 2 = 17"}]}


@pytest.fixture(scope="module")
def own_stack(tmp_path_factory, envoy_binary):
    # A private stack: this test kills its router.
    ports = StackPorts.free()
    s = Stack(tmp_path_factory.mktemp("router-down"), ports)
    s.start()
    yield s
    s.stop()


def post(stack, body, headers=None):
    return httpx.post(f"{stack.url}/v1/chat/completions", json=body, headers=headers or {}, timeout=10)


def test_traffic_flows_to_default_while_router_is_dead_and_routing_resumes(own_stack):
    assert post(own_stack, MATH).headers["x-mock-backend"] == "math-model"

    own_stack.kill_router(signal.SIGKILL)
    spoofs = [{"x-selected-model": "math-model"}]
    # Addresses Envoy would otherwise take as internal (private, loopback) must not make a
    # client's routing headers trusted either.
    # 192.0.2.1 is the one address the rendered config calls internal: a client claiming it in
    # x-forwarded-for is not believed either (use_remote_address).
    spoofs += [{"x-selected-model": "code-model", "x-forwarded-for": ip}
               for ip in ("10.0.0.1", "127.0.0.1", "192.168.1.5", "192.0.2.1")]
    for i in range(20):
        spoof = spoofs[i % len(spoofs)]
        r = post(own_stack, MATH, spoof)
        assert r.status_code == 200
        # failure_mode_allow: the request goes on unrouted, to the default backend, and a
        # client cannot pick a backend by sending the router's header itself.
        assert r.headers["x-mock-backend"] == "general-model"
        assert r.json()["model"] == "auto"
        assert "x-selected-model" not in r.json()["mock"]["headers"]
        assert "x-semantic-router-sent-at" not in r.json()["mock"]["headers"]  # the stamp is for the router only
    # A body that pins a backend model still reaches it: Envoy reads `model` itself (json_to_metadata),
    # the same path a request the router sheds at its headers takes.
    for model in ("code-model", "math-model"):
        r = post(own_stack, {**MATH, "model": model}, {"x-selected-model": "general-model"})
        assert r.status_code == 200 and r.headers["x-mock-backend"] == model
    assert post(own_stack, {**MATH, "model": "no-such-model"}).headers["x-mock-backend"] == "general-model"
    # Envoy reads the model of a body under 100 kB only (its parser holds a worker for the whole
    # body): a larger one goes where an unpinned one goes.
    padded = {**MATH, "model": "code-model", "metadata": {"pad": "x" * 100_000}}
    assert post(own_stack, padded).headers["x-mock-backend"] == "general-model"
    assert post(own_stack, {**padded, "metadata": {"pad": "x" * 99_000}}).headers["x-mock-backend"] == "code-model"

    own_stack.start_router()
    r = post(own_stack, MATH)
    assert r.headers["x-mock-backend"] == "math-model"
    assert r.headers["x-semantic-route-reason"] == "matched"


def test_launcher_restarts_a_killed_router_while_envoy_serves(own_stack):
    said: list[str] = []
    supervisor = RouterSupervisor(own_stack, say=said.append, min_backoff_s=0.5)
    own_stack.kill_router(signal.SIGKILL)
    served = []
    give_up = time.monotonic() + 180
    while supervisor.restarts == 0:
        assert time.monotonic() < give_up, said
        supervisor.poll()  # returns once the restarted router is serving
        r = post(own_stack, MATH)
        assert r.status_code == 200  # the gateway never went down
        served.append(r.headers["x-mock-backend"])
        time.sleep(0.1)
    assert "general-model" in served  # while the router was dead: default backend
    r = post(own_stack, MATH)
    assert r.headers["x-semantic-route-reason"] == "matched"  # routing resumed
    assert any("restarting in" in m for m in said) and said[-1] == "router back; routing resumed"


class FakeRouterProcess:
    def __init__(self, code=None):
        self.returncode = code

    def poll(self):
        return self.returncode


class FakeStack:
    def __init__(self, fail_starts: int):
        self.router = FakeRouterProcess(code=-9)
        self.fail_starts = fail_starts
        self.starts = 0

    def start_router(self):
        self.starts += 1
        if self.starts <= self.fail_starts:
            raise RuntimeError("router exited with 1 while starting:\nboom")
        self.router = FakeRouterProcess()


def test_restart_backoff_doubles_on_failure_and_resets_after_a_healthy_run():
    now = [0.0]
    stack = FakeStack(fail_starts=2)
    sup = RouterSupervisor(stack, say=lambda m: None, min_backoff_s=1, max_backoff_s=4, healthy_after_s=60,
                           clock=lambda: now[0])
    attempts = []
    for _ in range(200):
        before = stack.starts
        sup.poll()
        if stack.starts > before:
            attempts.append(now[0])
        now[0] += 0.25
    assert attempts == [1.0, 3.0, 7.0]  # waits of 1, 2, 4 s: failed, failed, back
    assert sup.restarts == 1 and sup.backoff == 4
    now[0] += 61
    sup.poll()
    assert sup.backoff == 1  # it stayed up: the next crash starts the ladder again
