"""Fits the cascade's first tier (router/static_tier.py) to a config the encoder already routes
well: the static tier's head on the encoder head's training split, its thresholds and, per route,
the margin at which its decision stands, chosen so that on held-out examples the decisions it keeps
agree with the encoder's (so the cascade's accuracy stays within `max_disagreement` of the encoder's).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from esr_config import RouterConfig
from router.classifier import RouteClassifier
from router.head import LinearHead
from router.static_tier import margins, static_config
from esr_tuning.fit import _train_head, tune_thresholds

# At most this share of the decisions the static tier keeps for a route may differ from the encoder's.
MAX_DISAGREEMENT = 0.004
# A margin stands only on this many held-out decisions at or above it: fewer say nothing.
MIN_SUPPORT = 30
NEVER = math.inf  # a route's accept margin when no margin was safe: the encoder decides all of its prompts


@dataclass
class StaticFit:
    config: RouterConfig
    head: LinearHead | None
    notes: list[str]


def fit_static_tier(config: RouterConfig, encoder_choices: np.ndarray, static_vectors: np.ndarray,
                    labels: list[str], intents: list[str] | None, static_encode, holdout: float = 0.2,
                    seed: int = 0, max_disagreement: float = MAX_DISAGREEMENT) -> StaticFit:
    """`encoder_choices`: the fitted encoder's choice per example (RouteClassifier.choose);
    `static_vectors`: the examples' static embeddings. A head config gets a static head trained on
    the encoder head's split (fit's), the rest held out; a similarity config holds out every example."""
    base = dataclasses.replace(config, static_tier=dataclasses.replace(config.static_tier, thresholds={}, accept={},
                                                                       head_path=None))
    head, held = None, np.arange(len(labels))
    if config.classifier.method == "head":
        head, _, held = _train_head(base, static_vectors, labels, intents, holdout, seed)
    classifier = RouteClassifier(static_config(base), static_encode, head=head)
    scores = classifier.scores(static_vectors[held])
    agree_with = encoder_choices[held]
    thresholds = tune_thresholds(classifier, scores, agree_with, objective="accuracy")
    names = [r.name for r in config.routes]
    tuned = dataclasses.replace(base, static_tier=dataclasses.replace(
        base.static_tier, thresholds={n: round(float(t), 4) for n, t in zip(names, thresholds)}))
    classifier = RouteClassifier(static_config(tuned), static_encode, head=head)
    choices = classifier.choose(scores)
    lead = margins(classifier, scores, choices)
    accept, notes, kept = {}, [], np.zeros(len(choices), dtype=bool)
    for index, name in [(i, n) for i, n in enumerate(names)] + [(-1, config.default_route.name)]:
        mine = np.flatnonzero(choices == index)
        level = _accept_level(lead[mine], choices[mine] == agree_with[mine], max_disagreement)
        accept[name] = math.ceil(level * 1e4) / 1e4 if math.isfinite(level) else NEVER
        kept[mine[lead[mine] >= level]] = True
    share = float(kept.mean()) if len(kept) else 0.0
    differ = float((kept & (choices != agree_with)).mean()) if len(kept) else 0.0
    notes.append(f"static tier: decides {share:.1%} of {len(held)} held-out examples, differing from the encoder "
                 f"on {differ:.2%} of them all (margins per route: {_shown(accept)})")
    fitted = dataclasses.replace(tuned, static_tier=dataclasses.replace(tuned.static_tier, accept=accept))
    if head is not None:  # margins are set: the head may now learn from every in-scope example
        head, _, _ = _train_head(base, static_vectors, labels, intents, 0.0, seed)
    return StaticFit(fitted, head, notes)


def _accept_level(lead: np.ndarray, agrees: np.ndarray, max_disagreement: float) -> float:
    """The lowest margin at which the decisions at or above it disagree at most `max_disagreement`
    of the time, over at least MIN_SUPPORT of them; inf where none does."""
    order = np.argsort(-lead, kind="stable")
    lead, wrong = lead[order], np.cumsum(~agrees[order])
    count = np.arange(1, len(lead) + 1)
    ok = (wrong <= max_disagreement * count) & (count >= MIN_SUPPORT)
    # Only where the next example's margin differs: a margin keeps every example that reaches it.
    ok &= np.append(lead[1:] < lead[:-1], True)
    hits = np.flatnonzero(ok)
    return float(lead[hits[-1]]) if hits.size else math.inf


def _shown(accept: dict) -> str:
    return ", ".join(f"{k} {'never' if not math.isfinite(v) else round(v, 3)}" for k, v in accept.items())
