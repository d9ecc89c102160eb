"""Closed-loop load through a stack: `concurrency` clients, each sending its next request as soon as
the last is answered, for `seconds`; what counts is the requests `one` says went as they should."""

from __future__ import annotations

import concurrent.futures
import time
from typing import Callable

import httpx


def closed_loop_rps(url: str, seconds: float, concurrency: int, one: Callable[[httpx.Client], bool],
                    timeout: float = 30.0) -> float:
    end, done = time.monotonic() + seconds, []

    def client():
        with httpx.Client(base_url=url, timeout=timeout) as http:
            while time.monotonic() < end:
                if one(http):
                    done.append(1)

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda _: client(), range(concurrency)))
    return len(done) / (time.monotonic() - t0)
