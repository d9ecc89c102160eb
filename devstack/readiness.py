"""Waiting for a process the stack started until it passes its readiness check."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from typing import Callable


def http_ok(url: str) -> bool:
    """Whether `url` answers 200 now."""
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def wait_ready(proc: subprocess.Popen, name: str, ready: Callable[[], bool], timeout: float,
               log_tail: Callable[[], str], poll_s: float = 0.2) -> None:
    """Returns once `ready()`; raises with the end of its log if `proc` exits or `timeout` passes."""
    give_up = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} while starting:\n{log_tail()}")
        if time.monotonic() > give_up:
            raise TimeoutError(f"{name} not ready after {timeout:.0f}s:\n{log_tail()}")
        time.sleep(poll_s)
