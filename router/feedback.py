"""Scores that arrive after a request was served, folded into model selection: each selected request
gets a signed selection id; an evaluator later posts that id with the score the answer earned, and
the router moves its prediction for that route and model towards what was seen.

Per (route, model) the router keeps an exponentially weighted mean of the residual (score seen less
the quality model's own prediction, which the id carries), shrunk towards zero by the weight of the
evidence (half at `prior` scores): a model whose answers got worse loses its traffic as the evidence
accumulates, not on one bad score. A small, counted share of requests (`explore`) goes to another
capable model so that a model that lost its traffic still earns scores, and can win it back.

The id is `<route>.<models>.<predicted, each>.<index of the selected one>.<issued, epoch s>.<nonce>.<mac>`,
names in base64url (comma-separated), predictions as float16 in hex, the MAC keyed BLAKE2b of the rest under the feedback
token: any process of a pool can verify an id another issued, and a client cannot make one up. It
names every model selection predicted for, so that where Envoy failed over, the score counts for
the model that answered: Envoy appends `~<that model>` to the id on the answer (esr_app/envoy_config.py),
and only a model the signed part names is taken. Ids older than `max_age_s`, and ids already scored
(by their signed part), are refused.
"""

from __future__ import annotations

import base64
import collections
import hashlib
import hmac
import itertools
import math
import os
import time
from dataclasses import dataclass

import numpy as np

SEEN = 65_536  # ids scored recently, remembered to refuse a second score for the same request
MAX_ID = 3072  # a posted id's length: five long model names and the route's fit (a feedback body is 4 KiB)
SERVED_SEPARATOR = "~"  # between a signed id and the model that answered (in no base64url text)


@dataclass(frozen=True)
class Issued:
    """What a verified selection id says of the request it was issued for."""

    route: str
    model: str  # the model the score counts for: the one that answered
    predicted: float  # the quality model's own prediction for it
    issued: float
    selected: str  # the model selection put first (another where Envoy failed over)
    key: str  # the signed part: one score per request, whatever follows it


class BadFeedback(ValueError):
    """A score the router refuses; `kind` names why (the metric's outcome label)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SelectionIds:
    """Issues and verifies selection ids under one secret."""

    def __init__(self, secret: bytes, max_age_s: float, clock=time.time):
        self._secret = secret
        self.max_age_s = max_age_s
        self._clock = clock
        self._seen: collections.OrderedDict[str, float] = collections.OrderedDict()  # id -> when issued
        self._forgotten_until = float("-inf")  # ids issued by then may have been scored and forgotten
        self._nonce, self._count = os.urandom(6).hex(), itertools.count()
        self._names: dict[tuple[str, tuple[str, ...]], str] = {}  # (route, models) -> their part of an id: a config's few

    def issue(self, route: str, models: tuple[str, ...], predicted: np.ndarray, first: int) -> str:
        """An id for a request whose `models` selection predicted `predicted` for, `models[first]` chosen."""
        names = self._names.get((route, models))
        if names is None:
            names = self._names[(route, models)] = f"{_b64(route.encode())}.{','.join(_b64(m.encode()) for m in models)}"
        # Predictions as float16 (a score's residual needs no finer; hex is the cheapest text of
        # bytes); the nonce: two requests in one second, or two processes, two ids.
        scores = np.asarray(predicted, dtype="<f2").tobytes().hex()
        body = f"{names}.{scores}.{first}.{round(self._clock())}.{self._nonce}{next(self._count)}"
        return f"{body}.{self._mac(body)}"

    def verify(self, selection_id: str) -> Issued:
        """`read`, and the id marked scored (`mark`)."""
        issued = self.read(selection_id)
        self.mark(issued)
        return issued

    def read(self, selection_id: str) -> Issued:
        """The request an id was issued for, the score counted for the model that answered (where
        Envoy appended it); BadFeedback where the id is not ours, too old, or scored already, or the
        model appended is not one selection predicted for."""
        signed, appended, served = selection_id.partition(SERVED_SEPARATOR)
        body, _, mac = signed.rpartition(".")
        if not body or not signed.isascii() or not hmac.compare_digest(mac, self._mac(body)):
            raise BadFeedback("bad_id", "selection_id was not issued by this router")
        try:  # ours (the MAC holds): its parts are as issue() wrote them
            route, models, scores, first, issued, _ = body.split(".")
            names = [_unb64(m).decode() for m in models.split(",")]
            predicted = np.frombuffer(bytes.fromhex(scores), "<f2").tolist()
            if len(predicted) != len(names):
                raise ValueError("a prediction for each model")
            selected = names[int(first)]
            at = float(issued)
        except (ValueError, IndexError):
            raise BadFeedback("bad_id", "selection_id was not issued by this router") from None
        # No suffix: the id as the router set it (a route with no failover): the selected model's.
        # A suffix naming no model ("", Envoy's "-"): no backend answered, Envoy did.
        model = served.strip() if appended else selected
        if model not in names:
            raise BadFeedback("unattributed", f"the answer came from {model[:100]!r}, a model selection did not "
                              "predict for: its score would correct nothing")
        found = Issued(_unb64(route).decode(), model, predicted[names.index(model)], at, selected, signed)
        if self._clock() - found.issued > self.max_age_s:
            raise BadFeedback("expired", f"selection_id is older than {self.max_age_s:g} s")
        if found.issued <= self._forgotten_until:  # its first score may have been forgotten: refused as old
            raise BadFeedback("expired", "selection_id is older than the scores this router still remembers")
        if signed in self._seen:
            raise BadFeedback("repeated", "this selection_id was scored already")
        return found

    def mark(self, issued: Issued) -> None:
        """Remembers a read id as scored: BadFeedback where it was meanwhile."""
        if issued.key in self._seen:
            raise BadFeedback("repeated", "this selection_id was scored already")
        self._seen[issued.key] = issued.issued
        if len(self._seen) > SEEN:
            _, issued_at = self._seen.popitem(last=False)
            self._forgotten_until = max(self._forgotten_until, issued_at)

    def _mac(self, body: str) -> str:
        return _b64(hashlib.blake2b(body.encode("ascii"), key=self._secret[:64], digest_size=16).digest())


class FeedbackBook:
    """Per (route, model): how far the quality model's predictions have been off, as scores said."""

    def __init__(self, half_life: float = 200.0, prior: float = 20.0):
        self._keep = 0.5 ** (1.0 / half_life)  # each new score weighs the past by this
        self._prior = prior
        self._state: dict[tuple[str, str], tuple[float, float]] = {}  # (weight, weighted mean residual)

    def add(self, route: str, model: str, predicted: float, score: float) -> None:
        weight, mean = self._state.get((route, model), (0.0, 0.0))
        weight = weight * self._keep + 1.0
        mean += (score - predicted - mean) / weight
        self._state[(route, model)] = (weight, mean)

    def correction(self, route: str, model: str) -> float:
        """What to add to the model's predicted score on this route: the residual's mean, shrunk
        towards 0 by how little evidence there is."""
        return (self.corrections(route, (model,)) or [0.0])[0]

    def corrections(self, route: str, models: tuple[str, ...]) -> list[float] | None:
        """Each model's correction on `route` (as `correction`, in one pass: every selected request
        asks); None where none has had a score (nothing to add)."""
        state, prior, out, seen = self._state, self._prior, [], False
        for m in models:
            weight, mean = state.get((route, m), (0.0, 0.0))
            seen = seen or weight > 0
            out.append(mean * weight / (weight + prior))
        return out if seen else None


def parse_feedback(body: object) -> tuple[str, float]:
    """(selection_id, score) from a feedback body `{"selection_id": str, "score": 0..1}`."""
    if not isinstance(body, dict):
        raise BadFeedback("bad_body", 'the body must be a JSON object {"selection_id": ..., "score": 0..1}')
    selection_id, score = body.get("selection_id"), body.get("score")
    if not isinstance(selection_id, str) or not 0 < len(selection_id) <= MAX_ID:
        raise BadFeedback("bad_body", "selection_id must be the x-semantic-selection-id the answer carried")
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score) \
            or not 0.0 <= score <= 1.0:
        raise BadFeedback("bad_body", "score must be a number between 0 and 1")
    return selection_id, float(score)
