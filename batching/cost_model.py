"""What a batch costs, learned online from the batches that ran: seconds = fixed + per_token x padded tokens.

A least-squares line over recent batches, older ones fading geometrically, so the model follows
the machine as it gets busier or quieter (a neighbour process, a CPU quota, thermal limits).
"""

from __future__ import annotations

import threading


class BatchCostModel:
    """Thread-safe: the model thread observes, the event loop predicts."""

    def __init__(self, forget: float = 0.9, min_batches: int = 3):
        self._forget = forget
        self._min = min_batches
        self._lock = threading.Lock()
        # Weighted sums for the 2x2 normal equations (w, w x, w x^2, w y, w x y).
        self._s = [0.0] * 5
        self._n = 0
        self._fixed = 0.0
        self._per_token = 0.0

    @property
    def ready(self) -> bool:
        """True once enough batches ran for predictions to mean something."""
        return self._n >= self._min

    def observe(self, padded_tokens: int, seconds: float) -> None:
        x, y = float(padded_tokens), float(seconds)
        with self._lock:
            f = self._forget
            s = self._s
            for i, v in enumerate((1.0, x, x * x, y, x * y)):
                s[i] = s[i] * f + v
            self._n += 1
            self._fixed, self._per_token = _fit(s)

    def predict(self, padded_tokens: float) -> float:
        """Seconds for one batch of `padded_tokens`; 0 before the model is ready."""
        if not self.ready:
            return 0.0
        return self._fixed + self._per_token * padded_tokens

    def max_tokens_within(self, seconds: float) -> float:
        """The most padded tokens one batch can hold and still finish within `seconds`."""
        if not self.ready:
            return float("inf")
        if self._per_token <= 0:
            return float("inf") if seconds >= self._fixed else 0.0
        return (seconds - self._fixed) / self._per_token

    @property
    def coefficients(self) -> tuple[float, float]:
        return self._fixed, self._per_token


def _fit(s: list[float]) -> tuple[float, float]:
    w, sx, sxx, sy, sxy = s
    det = w * sxx - sx * sx
    mean_x, mean_y = sx / w, sy / w
    # The whole cost taken as proportional to size: errs towards predicting too much, not too little.
    proportional = (0.0, mean_y / mean_x if mean_x > 0 else 0.0)
    if det <= 1e-9 * max(1.0, w * sxx):  # batches all of one size (an idle router sees singles) pin no slope
        return proportional
    per_token = (w * sxy - sx * sy) / det
    fixed = (sy - per_token * sx) / w
    if per_token < 0:  # noise can tilt the line; a batch never gets cheaper with more tokens
        return mean_y, 0.0
    return proportional if fixed < 0 else (fixed, per_token)
