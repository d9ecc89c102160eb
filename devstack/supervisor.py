"""Restarts a dead router the way Kubernetes restarts a sidecar: with backoff, Envoy serving meanwhile."""

from __future__ import annotations

import time
from typing import Callable

from devstack.stack import Stack


class RouterSupervisor:
    """Call `poll()` every fraction of a second. While the router is down Envoy's
    `failure_mode_allow` sends requests on to the default backend; once it is back, routing resumes."""

    def __init__(self, stack: Stack, say: Callable[[str], None] = print, min_backoff_s: float = 1.0,
                 max_backoff_s: float = 30.0, healthy_after_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.stack = stack
        self.say = say
        self.min_backoff, self.max_backoff, self.healthy_after = min_backoff_s, max_backoff_s, healthy_after_s
        self.clock = clock
        self.backoff = min_backoff_s
        self.restarts = 0
        self._up_since = clock()
        self._restart_at: float | None = None

    def poll(self) -> None:
        router = self.stack.router
        now = self.clock()
        if router is not None and router.poll() is None:
            if now - self._up_since >= self.healthy_after:
                self.backoff = self.min_backoff  # it stayed up: the next crash starts the ladder again
            return
        if self._restart_at is None:
            code = None if router is None else router.returncode
            self._restart_at = now + self.backoff
            self.say(f"router exited with {code}; Envoy keeps serving on the default backend; "
                     f"restarting in {self.backoff:g}s")
            return
        if now < self._restart_at:
            return
        self.backoff = min(2 * self.backoff, self.max_backoff)
        try:
            self.stack.start_router()
        except (RuntimeError, TimeoutError) as exc:
            self._restart_at = self.clock() + self.backoff
            self.say(f"router restart failed ({str(exc).splitlines()[0]}); next try in {self.backoff:g}s")
            return
        self.restarts += 1
        self._restart_at = None
        self._up_since = self.clock()
        self.say("router back; routing resumed")
