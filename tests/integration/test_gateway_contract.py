"""The Gateway API Inference Extension's contract, through the real Envoy: routes that match the
standard `x-gateway-model-name` header (as an HTTPRoute does) send every prompt to the model the
router chose; an adapter's base model rides along; grpc.health.v1 answers on a port of its own."""

from __future__ import annotations

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devstack.stack import free_port, stack_with
from tests.support.stack import SESSION_DEADLINE_MS


@pytest.fixture(scope="module")
def standard(tmp_path_factory, envoy_binary):
    health_port = free_port()

    def change(config):
        config["server"].update({"deadline_ms": SESSION_DEADLINE_MS, "health_port": health_port,
                                 "base_models": {"math-model": "llama-3-8b"}})
        config.setdefault("envoy", {})["route_header"] = "x-gateway-model-name"

    with stack_with(tmp_path_factory.mktemp("standard"), change) as stack:
        yield stack, health_port


@pytest.mark.parametrize("prompt, model", [
    ("Solve the equation 4x - 7 = 21 for x", "math-model"),
    ("Write a Python function that reverses a linked list", "code-model"),
    ("What's a good name for a golden retriever puppy?", "general-model"),
])
def test_routes_matching_the_standard_header_reach_the_chosen_model(standard, prompt, model):
    stack, _ = standard
    r = httpx.post(f"{stack.url}/v1/chat/completions", timeout=30,
                   json={"model": "auto", "messages": [{"role": "user", "content": prompt}]},
                   headers={"x-gateway-model-name": "code-model"})  # a client's copy decides nothing
    assert r.status_code == 200 and r.headers["x-mock-backend"] == model
    seen = r.json()["mock"]["headers"]
    assert seen["x-gateway-model-name"] == seen["x-selected-model"] == model
    assert seen.get("x-gateway-base-model-name") == ("llama-3-8b" if model == "math-model" else None)


def test_health_answers_on_its_own_port_as_on_the_ext_proc_port(standard):
    stack, health_port = standard
    for port in (health_port, stack.ports.router_grpc):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING, port
