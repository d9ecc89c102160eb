"""Rollout: the Envoy container's preStop (deploy/kubernetes/base/envoy-drain.sh) drains Envoy, so a
streamed completion in flight when Kubernetes stops the pod finishes; SIGTERM alone cuts it."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import threading
import time

import httpx
import pytest

from devstack.stack import ROOT, free_port, on_stack_ports
from esr_config import load_config
from tests.support.stack import envoy_alone

DRAIN_SCRIPT = ROOT / "deploy" / "kubernetes" / "base" / "envoy-drain.sh"
ENVOY_ARGS = ("--drain-strategy", "immediate", "--drain-time-s", "100")  # as the Deployment runs it
CHUNK_PAUSE_MS = 600  # the mock streams 4 chunks: about 2.4 s per completion


class StreamedCompletion(threading.Thread):
    """One streamed chat completion through `url`, every SSE line kept with when it came."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.lines, self.error, self.first = url, [], None, threading.Event()

    def run(self) -> None:
        try:
            with httpx.stream("POST", f"{self.url}/v1/chat/completions", timeout=30,
                              headers={"x-mock-chunk-delay-ms": str(CHUNK_PAUSE_MS)},
                              json={"model": "auto", "stream": True,
                                    "messages": [{"role": "user", "content": "integrate x squared"}]}) as r:
                assert r.status_code == 200, r.status_code
                for line in r.iter_lines():
                    if line:
                        self.lines.append((time.monotonic(), line))
                        self.first.set()
        except Exception as exc:  # noqa: BLE001  (the cut stream is what one test expects)
            self.error = exc
        finally:
            self.first.set()

    @property
    def complete(self) -> bool:
        return self.error is None and bool(self.lines) and self.lines[-1][1] == "data: [DONE]"


@pytest.fixture
def own_envoy(stack, envoy_binary, tmp_path):
    """A private Envoy in front of the session stack's router and backends (stopping the shared
    one would end every later test's gateway)."""
    ports = dataclasses.replace(stack.ports, listener=free_port(), admin=free_port())
    config = on_stack_ports(load_config(ROOT / "router.yaml"), ports)
    with envoy_alone(envoy_binary, config, tmp_path, ENVOY_ARGS) as envoy:
        yield envoy, f"http://127.0.0.1:{ports.listener}", f"127.0.0.1:{ports.admin}"


def test_prestop_drain_lets_a_streamed_completion_finish_before_sigterm(own_envoy):
    envoy, url, admin = own_envoy
    stream = StreamedCompletion(url)
    stream.start()
    assert stream.first.wait(10) and stream.error is None, stream.error
    started = time.monotonic()
    hook = subprocess.run(["bash", str(DRAIN_SCRIPT), admin, "30", "0"], timeout=60)
    hook_ended = time.monotonic()
    assert hook.returncode == 0
    # Kubernetes sends SIGTERM once the hook returns: the stream must already be whole.
    envoy.send_signal(signal.SIGTERM)
    envoy.wait(timeout=30)
    stream.join(10)
    assert stream.complete, (stream.error, stream.lines[-1:])
    assert len(stream.lines) >= 4 and '"model": "math-model"' in stream.lines[0][1]  # routed, then streamed
    # The hook waited for the stream (not a fixed sleep), and returned soon after it ended.
    last = stream.lines[-1][0]
    assert started < last <= hook_ended < last + 3


def test_a_draining_gateway_answers_new_requests_with_connection_close_and_fails_readiness(own_envoy):
    _, url, admin = own_envoy
    stream = StreamedCompletion(url)  # holds the drain open while we look
    stream.start()
    assert stream.first.wait(10)
    hook = subprocess.Popen(["bash", str(DRAIN_SCRIPT), admin, "30", "0"])
    try:
        deadline = time.monotonic() + 10
        while httpx.get(f"{url}/healthz", timeout=5).status_code != 503:
            assert time.monotonic() < deadline, "GET /healthz never failed while draining"
            time.sleep(0.1)
        r = httpx.post(f"{url}/v1/chat/completions", timeout=10,
                       json={"model": "auto", "messages": [{"role": "user", "content": "integrate x squared"}]})
        assert r.status_code == 200 and r.headers["x-semantic-route"] == "math"  # still routed
        assert r.headers["connection"] == "close"  # and told to go elsewhere next time
    finally:
        assert hook.wait(timeout=60) == 0
    stream.join(10)
    assert stream.complete


def test_without_the_drain_sigterm_cuts_the_stream(own_envoy):
    """What the hook prevents: this is the old preStop (a sleep), then SIGTERM mid-stream."""
    envoy, url, _ = own_envoy
    stream = StreamedCompletion(url)
    stream.start()
    assert stream.first.wait(10)
    envoy.send_signal(signal.SIGTERM)
    envoy.wait(timeout=30)
    stream.join(10)
    assert not stream.complete


def test_the_hook_returns_at_once_when_envoy_is_gone():
    """A hook that cannot reach the admin must not hold the pod for its whole wait."""
    # Waiting out its 60 s would overrun this 30 s limit (TimeoutExpired fails the test).
    hook = subprocess.run(["bash", str(DRAIN_SCRIPT), f"127.0.0.1:{free_port()}", "60", "0"], timeout=30,
                          capture_output=True)
    assert hook.returncode == 0
