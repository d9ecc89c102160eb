"""What a batch costs, learned online from the batches that ran: seconds = fixed + per_token x padded tokens.

A least-squares line over recent batches, older ones fading geometrically, so the model follows
the machine as it gets busier or quieter (a neighbour process, a CPU quota, thermal limits).
Batches all of one size (an idle router sees singles) pin no slope: then the split between the
fixed and per-token parts comes from the backend's warm-up (`calibrate`), and only the level from
traffic. Without a calibration the whole cost is taken as per-token, which errs high for a long
prompt after short ones (`python -m bench.frontend.long_prompt_cost` measures both).
"""

from __future__ import annotations

import math
import threading


CALIBRATED_SHARE = 0.5  # of the warm-up's fixed part that predictions count as fixed (calibrate)


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
        self._overhead = 0.0  # the fixed part in tokens' worth (calibrate); 0: all per-token

    @property
    def ready(self) -> bool:
        """True once enough batches ran for predictions to mean something."""
        return self._n >= self._min

    def observe(self, padded_tokens: int, seconds: float) -> None:
        with self._lock:
            _accumulate(self._s, padded_tokens, seconds, self._forget)
            self._n += 1
            self._fixed, self._per_token = _fit(self._s, self._overhead)

    def calibrate(self, timed) -> None:
        """(padded tokens, seconds) of warm batches at two sizes or more: keeps only how the cost
        divides (the fixed part as so many tokens' worth, CALIBRATED_SHARE of it), since the level
        moves with the load."""
        timed = list(timed)
        if len({x for x, _ in timed}) < 2:
            return
        s = [0.0] * 5
        for x, y in timed:
            _accumulate(s, x, y)
        fixed, per_token = _line(s)
        with self._lock:
            # Half of it: contention slows the per-token part more than the fixed one (the bundled
            # model here: 31 tokens' worth alone, 18 beside two CPU-bound neighbours), and a
            # prediction that errs low lets a batch finish after its deadline.
            self._overhead = CALIBRATED_SHARE * fixed / per_token if fixed > 0 and per_token > 0 else 0.0
            if self._n:
                self._fixed, self._per_token = _fit(self._s, self._overhead)

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


def _accumulate(s: list[float], tokens: float, seconds: float, forget: float = 1.0) -> None:
    """Adds one batch to the sums of the 2x2 normal equations, the earlier ones weighed by `forget`."""
    x, y = float(tokens), float(seconds)
    for i, v in enumerate((1.0, x, x * x, y, x * y)):
        s[i] = s[i] * forget + v


def _line(s: list[float]) -> tuple[float, float]:
    """The weighted least-squares line (fixed, per_token); (nan, nan) when the sizes do not vary."""
    w, sx, sxx, sy, sxy = s
    det = w * sxx - sx * sx
    if det <= 1e-9 * max(1.0, w * sxx):
        return float("nan"), float("nan")
    per_token = (w * sxy - sx * sy) / det
    return (sy - per_token * sx) / w, per_token


def _fit(s: list[float], overhead: float = 0.0) -> tuple[float, float]:
    w, sx, _, sy, _ = s
    mean_x, mean_y = sx / w, sy / w
    # The calibrated split, at the level traffic shows; with no calibration the whole cost taken as
    # proportional to size: errs towards predicting too much, not too little.
    per = mean_y / (mean_x + overhead) if mean_x + overhead > 0 else 0.0
    shaped = (overhead * per, per)
    fixed, per_token = _line(s)
    if math.isnan(fixed):  # batches all of one size (an idle router sees singles) pin no slope
        return shaped
    if per_token < 0:  # noise can tilt the line; a batch never gets cheaper with more tokens
        return mean_y, 0.0
    return shaped if fixed < 0 else (fixed, per_token)
