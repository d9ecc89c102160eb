"""Waiting for a condition in tests: one helper, always bounded, failing with what it waited for."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, Callable


def _poll(predicate: Callable[[], Any], end: float, timeout: float, what: str) -> Any:
    """The predicate's value if truthy, None to poll again; AssertionError once `end` has passed."""
    value = predicate()
    if value:
        return value
    if time.monotonic() >= end:
        raise AssertionError(f"not reached within {timeout:g} s: {what}")
    return None


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """The predicate's first truthy value, polled every `interval` seconds."""
    end = time.monotonic() + timeout
    while (value := _poll(predicate, end, timeout, what)) is None:
        time.sleep(interval)
    return value


async def until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.01) -> Any:
    """wait_for on an event loop: the loop keeps running between polls. The predicate may be a
    coroutine function (a health check over gRPC, say)."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if (value := _poll(lambda: value, end, timeout, what)) is not None:
            return value
        await asyncio.sleep(interval)
