"""Waiting for a condition in tests: one helper, always bounded, failing with what it waited for."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """The predicate's first truthy value, polled every `interval` seconds; AssertionError after `timeout`."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= end:
            raise AssertionError(f"not reached within {timeout:g} s: {what}")
        time.sleep(interval)


async def until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.01) -> Any:
    """wait_for on an event loop: the loop keeps running between polls."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= end:
            raise AssertionError(f"not reached within {timeout:g} s: {what}")
        await asyncio.sleep(interval)
