"""A circuit breaker: after several calls in a row fail, stop calling and let probes find out when
the other side is back, so that a down engine costs callers nothing and gets no retry storm."""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)


class CircuitBreaker:
    """Thread-safe. `probe` is called on a thread of the breaker's own while it is open, first
    after `probe_s` and then at doubling intervals up to `max_probe_s`; its first success closes
    the breaker. Callers ask `closed` before each call and report how the call went."""

    def __init__(self, probe: Callable[[], None], failures_to_open: int = 5, probe_s: float = 0.25,
                 max_probe_s: float = 5.0, on_change: Callable[[bool], None] | None = None, name: str = "remote"):
        self._probe = probe
        self.failures_to_open = failures_to_open
        self.probe_s, self.max_probe_s = probe_s, max_probe_s
        self._on_change = on_change or (lambda is_open: None)
        self.name = name
        self._lock = threading.Lock()
        self._failures = 0
        self._open = False
        self._stopped = threading.Event()
        self._prober: threading.Thread | None = None

    @property
    def closed(self) -> bool:
        return not self._open

    def succeeded(self) -> None:
        self._failures = 0  # a racing failure count is off by one at most: no lock on the hot path

    def failed(self, why: str) -> None:
        with self._lock:
            self._failures += 1
            if self._open or self._failures < self.failures_to_open:
                return
            self._open = True
        log.warning("remote engine failing: calls stopped, probing for its return",
                    extra={"breaker": self.name, "failures": self.failures_to_open, "last_error": why})
        self._on_change(True)
        self._prober = threading.Thread(target=self._probe_until_back, name=f"{self.name}-probe", daemon=True)
        self._prober.start()

    @property
    def probing(self) -> bool:
        """Whether a probe thread is running (the breaker is open and not stopped)."""
        return self._prober is not None and self._prober.is_alive()

    def stop(self) -> None:
        """No more probes (shutdown)."""
        self._stopped.set()

    def _probe_until_back(self) -> None:
        wait, since = self.probe_s, time.monotonic()
        while not self._stopped.wait(wait):
            try:
                self._probe()
            except Exception as exc:
                log.debug("probe failed: %s", exc)
                wait = min(self.max_probe_s, 2 * wait)
                continue
            with self._lock:
                self._open, self._failures = False, 0
            log.warning("remote engine back: calls resumed",
                        extra={"breaker": self.name, "down_s": round(time.monotonic() - since, 1)})
            self._on_change(False)
            return
