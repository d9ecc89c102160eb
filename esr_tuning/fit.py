"""Tunes a routes config on labelled data: per-route thresholds, top-k, or a trained head."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import numpy as np

from router.calibration import Calibrator
from router.classifier import RouteClassifier
from esr_config import RouterConfig
from router.config import ClassifierConfig
from router.head import HIDDEN_BATCH, HIDDEN_EPOCHS, LinearHead, train_head
from esr_tuning.calibration import Examples, calibrate, labelled_examples, reliability
from esr_tuning.evaluation import SHIFTED_DEFAULT_SHARE, shifted_accuracy

TOP_K_CANDIDATES = (1, 3, 5, 10)
HEAD_SCORES: tuple[Literal["probability", "energy"], ...] = ("probability", "energy")


@dataclass
class FitResult:
    config: RouterConfig
    head: LinearHead | None
    notes: list[str]


def label_indices(config: RouterConfig, labels: list[str]) -> np.ndarray:
    """Route index per label, -1 for the default route (the convention of RouteClassifier.choose)."""
    index = {r.name: i for i, r in enumerate(config.routes)}
    return np.asarray([index.get(label, -1) for label in labels])


OBJECTIVES = ("shifted", "accuracy", "balanced")  # what tune_thresholds can maximise (the CLI's choices)
DEFAULT_SHARE = SHIFTED_DEFAULT_SHARE  # the default-route share the `shifted` objective assumes


def objective_function(truth: np.ndarray, objective: str = "shifted", min_default_recall: float = 0.0):
    """What tuning maximises (see tune_thresholds), as a function of the chosen route indices."""
    in_scope = truth >= 0
    has_both = in_scope.any() and (~in_scope).any()
    weight = {"balanced": 0.5, "shifted": DEFAULT_SHARE}.get(objective) if has_both else None

    def value(chosen: np.ndarray) -> float:
        hit = chosen == truth
        result = shifted_accuracy(hit, in_scope, weight) if weight is not None else float(hit.mean())
        if has_both and min_default_recall > 0:
            recall = float(hit[~in_scope].mean())
            if recall < min_default_recall:
                return recall - 1.0  # below every admissible value, but still climbing towards it
        return result

    return value


def tune_thresholds(
    classifier: RouteClassifier,
    scores: np.ndarray,
    truth: np.ndarray,
    rounds: int = 2,
    objective: str = "shifted",
    min_default_recall: float = 0.0,
    per_route: bool = True,
) -> np.ndarray:
    """Thresholds that maximise `objective`: one shared value first, then (per_route) each route in turn.

    shifted: accuracy as if DEFAULT_SHARE of the traffic were the default route's (in-scope accuracy
    and default-route recall weighted 1 - DEFAULT_SHARE and DEFAULT_SHARE), so thresholds hold when
    out-of-scope traffic grows. accuracy: plain accuracy, at the data's own mix. balanced: the mean
    of in-scope accuracy and default-route recall.
    min_default_recall: among thresholds whose default-route recall reaches it, the most accurate
    (out-of-scope examples are usually too few for accuracy alone to care about them).
    """
    value_of = objective_function(truth, objective, min_default_recall)

    def accuracy(th: np.ndarray) -> float:
        return value_of(classifier.choose(scores, th))

    n_routes = len(classifier.routes)
    route_scores = scores[:, :n_routes]
    top = route_scores.argmax(axis=1)
    q = np.linspace(0.0, 1.0, 201)
    # Candidates: the scores a threshold actually decides on (each row's best route).
    grid = np.unique(np.quantile(route_scores.max(axis=1), q))
    best = max(grid, key=lambda t: accuracy(np.full(n_routes, t, dtype=np.float32)))
    th = np.full(n_routes, best, dtype=np.float32)
    for _ in range(rounds if per_route else 0):
        for r in range(n_routes):
            own = route_scores[top == r, r]
            if own.size == 0:
                continue
            candidates = np.unique(np.concatenate([np.quantile(own, q), [th[r]]]))
            trial = th.copy()
            results = []
            for c in candidates:
                trial[r] = c
                results.append((accuracy(trial), -abs(c - th[r]), c))
            th[r] = max(results)[2]
    return th


def _split(labels: list[str], holdout: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Stratified train / tune index split."""
    rng = np.random.default_rng(seed)
    train: list[np.ndarray] = []
    tune: list[np.ndarray] = []
    for label in sorted(set(labels)):
        idx = np.flatnonzero(np.asarray(labels) == label)
        rng.shuffle(idx)
        cut = max(1, int(round(len(idx) * holdout))) if len(idx) > 1 else 0
        tune.extend(idx[:cut])
        train.extend(idx[cut:])
    return np.asarray(sorted(train)), np.asarray(sorted(tune))


def fit(
    config: RouterConfig,
    encode,
    embeddings: np.ndarray,
    labels: list[str],
    with_head: bool = False,
    tune_top_k: bool = True,
    holdout: float = 0.2,
    seed: int = 0,
    objective: str = "shifted",
    intents: list[str] | None = None,
    min_default_recall: float = 0.0,
    per_route: bool = True,
    head_score: Literal["probability", "energy"] | None = None,
    calibration_share: float | None = SHIFTED_DEFAULT_SHARE,
) -> FitResult:
    """head_score: the head's score (ClassifierConfig.head_score); None chooses it on the held-out examples."""
    notes = []
    truth = label_indices(config, labels)
    tuning = dict(objective=objective, min_default_recall=min_default_recall, per_route=per_route)
    source = config
    head = None
    if with_head:
        head, train_idx, tune_idx = train_split_head(config, embeddings, labels, intents, holdout, seed)
        notes.append(
            f"head: {len(head.classes)} classes over {len(set(head.routes))} routes, trained on {len(train_idx)} "
            f"examples; thresholds tuned on {len(tune_idx)} held-out ones (default-route examples included)"
        )
        candidates = [_on_scale(config, dataclasses.replace(config.classifier, method="head", head_score=score))
                      for score in (HEAD_SCORES if head_score is None else (head_score,))]
        config, thresholds = _best_of(candidates, encode, head, embeddings[tune_idx], truth[tune_idx], notes,
                                      lambda c: f"head_score={c.classifier.head_score}", **tuning)
    elif tune_top_k and config.classifier.method == "similarity":
        candidates = [_on_scale(config, dataclasses.replace(config.classifier, top_k=k, aggregation="mean"))
                      for k in TOP_K_CANDIDATES]
        config, thresholds = _best_of(candidates, encode, None, embeddings, truth, notes,
                                      lambda c: f"top_k={c.classifier.top_k}", **tuning)
    else:
        config, thresholds = _best_of([_on_scale(config, config.classifier)], encode, None, embeddings, truth,
                                      notes, None, **tuning)
    if source.conversation.gate is not None and config.conversation.gate is None:
        notes.append(f"conversation.gate {source.conversation.gate} dropped: it was on another score scale "
                     "(fit on conversations to choose one)")
    routes = tuple(dataclasses.replace(r, threshold=round(float(t), 4)) for r, t in zip(config.routes, thresholds))
    config = dataclasses.replace(config, routes=routes)
    # Calibrated where the scorer was not fitted: the held-out examples of a head trained without
    # them; a similarity scorer's utterances are the config's, so every example is held out.
    held = tune_idx if with_head else np.arange(len(labels))
    classifier = RouteClassifier(config, encode, head=head)
    config = with_calibration(config, labelled_examples(classifier, classifier.scores(embeddings[held]), truth[held]),
                              calibration_share, notes)
    if with_head:
        # The thresholds are set; the head itself may now learn from every in-scope example.
        head, _, _ = train_split_head(config, embeddings, labels, intents, 0.0, seed)
        notes.append("head retrained on all in-scope examples")
    return FitResult(config, head, notes)


def with_calibration(config: RouterConfig, examples: Examples, default_share: float | None,
                     notes: list[str]) -> RouterConfig:
    """`config` with the confidence map fitted on `examples` (esr_tuning/calibration.py) for traffic that
    is `default_share` the default route's (None: the examples' own mix), noted with its figures."""
    calibration = calibrate(examples, default_share)
    calibrator = Calibrator(calibration)
    measured = reliability([calibrator.confidence(k, x, 0.0) for k, x in zip(examples.kinds, examples.x)],
                           examples.right, weight=examples.weights(default_share))
    notes.append(f"confidence calibrated on {len(examples.kinds)} held-out decisions: ECE {measured['ece']}, "
                 f"AUROC {measured['auroc']} (in sample)")
    return dataclasses.replace(config, calibration=calibration)


def _on_scale(source: RouterConfig, classifier: ClassifierConfig) -> RouterConfig:
    """`source` under `classifier`, its route thresholds cleared: fit tunes each afresh. The values on
    the score's scale that fit does not tune here (default_threshold, conversation.gate) stay only
    when the scale does: a cosine or a probability means nothing as an energy, and an energy above
    1 is out of range for the others."""
    routes = tuple(dataclasses.replace(r, threshold=None) for r in source.routes)
    if classifier.scale == source.classifier.scale:
        return dataclasses.replace(source, classifier=classifier, routes=routes)
    # The static tier's thresholds and margins are on the scale too (fit fits the tier afresh after).
    static = dataclasses.replace(source.static_tier, thresholds={}, accept={})
    return dataclasses.replace(source, classifier=classifier, routes=routes,
                               default_threshold=RouterConfig.default_threshold,  # the field's default
                               conversation=dataclasses.replace(source.conversation, gate=None), static_tier=static)


def _best_of(candidates: list[RouterConfig], encode, head: LinearHead | None, embeddings: np.ndarray,
             truth: np.ndarray, notes: list[str], describe, **tuning) -> tuple[RouterConfig, np.ndarray]:
    """The candidate config that scores best on `embeddings` with thresholds tuned for each (first on
    ties), and its thresholds; `describe` names a candidate in `notes` (None: no note)."""
    best = None
    value_of = objective_function(truth, tuning["objective"], tuning["min_default_recall"])
    # Without both in-scope and default-route examples every objective is plain accuracy.
    scored = tuning["objective"] if (truth >= 0).any() and (truth < 0).any() else "accuracy"
    for config in candidates:
        classifier = RouteClassifier(config, encode, head=head)
        scores = classifier.scores(embeddings)
        thresholds = tune_thresholds(classifier, scores, truth, **tuning)
        value = value_of(classifier.choose(scores, thresholds))
        if describe is not None:
            notes.append(f"{describe(config)}: {scored} {value:.4f} with tuned thresholds")
        if best is None or value > best[0]:
            best = (value, config, thresholds)
    if best is None:
        raise ValueError("no candidate configs to choose from")
    return best[1], best[2]


def head_split(config: RouterConfig, labels: list[str], intents: list[str] | None, holdout: float, seed: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """(the examples a head learns from: in-scope, `holdout` of each intent held out; the rest,
    the default route's examples among them)."""
    default = config.default_route.name
    fine = intents or labels
    in_scope = np.asarray([i for i, label in enumerate(labels) if label != default])
    out_scope = np.asarray([i for i, label in enumerate(labels) if label == default], dtype=np.int64)
    train_rel, tune_rel = _split([fine[i] for i in in_scope], holdout, seed) if holdout > 0 else (
        np.arange(len(in_scope)), np.arange(0))
    return in_scope[train_rel], np.concatenate([in_scope[tune_rel], out_scope])


def train_split_head(config: RouterConfig, embeddings: np.ndarray, labels: list[str], intents: list[str] | None,
                     holdout: float, seed: int, hidden: int = 0, teacher: np.ndarray | None = None
                     ) -> tuple[LinearHead, np.ndarray, np.ndarray]:
    """The head learns the routes (or their finer intents) from in-scope examples only; the
    default route is whatever scores below threshold, so its examples serve to tune that.
    `hidden`: ReLU units before the linear layer; `teacher`: (n, routes) each example's route
    distribution by another classifier, learnt half and half with the labels (routes as classes only)."""
    fine = intents or labels
    train_idx, tune_idx = head_split(config, labels, intents, holdout, seed)
    route_of = {fine[i]: labels[i] for i in train_idx}
    classes = sorted({fine[i] for i in train_idx})
    soft = None
    if teacher is not None and intents is None:
        names = [r.name for r in config.routes]
        columns = [names.index(c) for c in classes]
        picked = teacher[train_idx][:, columns]
        onehot = np.eye(len(classes))[[classes.index(labels[i]) for i in train_idx]]
        soft = 0.5 * onehot + 0.5 * picked / np.maximum(picked.sum(axis=1, keepdims=True), 1e-9)
    steps = dict(epochs=HIDDEN_EPOCHS, batch=HIDDEN_BATCH) if hidden else dict(epochs=config.classifier.head_epochs)
    head = train_head(embeddings[train_idx], [fine[i] for i in train_idx], classes,
                      routes=[route_of[c] for c in classes], seed=seed, hidden=hidden, soft=soft, **steps)
    return head, train_idx, tune_idx
