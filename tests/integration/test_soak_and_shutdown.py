"""A short soak (make soak runs 20,000) and SIGTERM under load, through the real Envoy."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from devstack.soak import fixed_threads, process_figures, settled_threads, soak, thread_names
from devstack.stack import Stack, StackPorts
from tests.support.stack import metric, scrape

SHORT_SOAK_REQUESTS = 3000


@pytest.fixture
def own_stack(tmp_path, envoy_binary):
    ports = StackPorts.free()
    s = Stack(tmp_path, ports)
    s.start()
    yield s
    s.stop()


def test_short_soak_answers_everything_without_leaks(own_stack):
    asyncio.run(soak(own_stack.url, 300))
    time.sleep(1.5)
    before = process_figures(own_stack.router.pid)
    threads_before = thread_names(own_stack.router.pid)
    tasks_before = metric(scrape(own_stack.metrics_url), "semantic_router_event_loop_tasks")
    result = asyncio.run(soak(own_stack.url, SHORT_SOAK_REQUESTS))
    time.sleep(2.5)  # gauges refresh every second
    threads_after = settled_threads(own_stack.router.pid, threads_before)
    after = process_figures(own_stack.router.pid)
    text = scrape(own_stack.metrics_url)
    print(f"\nshort soak: {result}, router {before} -> {after}")
    assert result["requests"] == SHORT_SOAK_REQUESTS
    assert result["statuses"] == {"200": SHORT_SOAK_REQUESTS}
    # Nothing beyond the warm baseline; only gRPC's elastic pool may have shrunk below it.
    assert not threads_after - threads_before, threads_after - threads_before
    assert fixed_threads(threads_after) == fixed_threads(threads_before), (threads_before, threads_after)
    assert metric(text, "semantic_router_event_loop_tasks") <= tasks_before + 2
    assert after["rss_mb"] - before["rss_mb"] < 60, (before, after)
    assert metric(text, "semantic_router_requests_total", 'outcome="fallback_error"') == 0


def test_sigterm_under_load_loses_no_request(own_stack):
    url = f"{own_stack.url}/v1/chat/completions"
    results: list[int] = []
    done = threading.Event()

    def one(i):
        r = httpx.post(url, timeout=30, json={"model": "auto", "messages": [{"role": "user", "content": f"solve {i}x = 3"}]})
        results.append(r.status_code)

    def fire():
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(one, range(400)))
        done.set()

    sender = threading.Thread(target=fire)
    sender.start()
    while len(results) < 100:
        time.sleep(0.01)
    own_stack.router.send_signal(signal.SIGTERM)
    code = own_stack.router.wait(timeout=60)
    sender.join(120)
    assert done.is_set()
    assert code == 0
    assert len(results) == 400 and set(results) == {200}
    log = own_stack.log_tail("router", 200)
    assert "shutdown requested" in log and "router stopped" in log
