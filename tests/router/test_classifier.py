"""Route classification on hand-placed vectors: thresholds, top-k, default examples, the head."""

from __future__ import annotations

import numpy as np
import pytest

from router.classifier import Decision, RouteClassifier
from esr_tuning.evaluation import evaluate
from esr_tuning.fit import fit, tune_thresholds
from router.head import LinearHead, train_head
from tests.support.fakes import config, encode, scatter, unit


def test_best_route_above_threshold_wins_else_default():
    clf = RouteClassifier(config(), encode)
    assert clf.classify(unit(1, 0.1, 0)).route == "math"
    assert clf.classify(unit(0, 1, 0.1)).route == "code"
    d = clf.classify(unit(0.3, 0.3, 1))
    assert (d.route, d.reason) == ("general", "default")


def test_per_route_threshold():
    cfg = config(routes=[
        {"name": "math", "model": "math-model", "utterances": ["m1"], "threshold": 0.99},
        {"name": "code", "model": "code-model", "utterances": ["c1"], "threshold": 0.1},
    ])
    clf = RouteClassifier(cfg, encode)
    # Closer to math, but math's own bar is higher: code clears its bar, so code wins.
    assert clf.classify(unit(1, 0.5, 0)).route == "code"


def test_top_k_mean_differs_from_max():
    probe = unit(0.2, 1, 0.1)  # equals m3, an outlier of math
    assert RouteClassifier(config(default_threshold=0.0), encode).classify(probe).route == "math"
    topk = config(default_threshold=0.0, classifier={"top_k": 3, "aggregation": "mean"})
    assert RouteClassifier(topk, encode).classify(probe).route == "code"


def test_default_route_examples_pull_prompts_to_default():
    cfg = config(default_threshold=0.0, default_route={"name": "general", "model": "general-model", "utterances": ["g1"]})
    clf = RouteClassifier(cfg, encode)
    assert clf.classify(unit(0.1, 0, 1)).reason == "default"
    assert clf.classify(unit(1, 0, 0.1)).route == "math"


def test_head_trained_at_load_from_utterances():
    clf = RouteClassifier(config(classifier={"method": "head"}, default_threshold=0.5), encode)
    assert clf.classify(unit(1, 0.05, 0)).route == "math"
    assert clf.classify(unit(0, 1, 0.2)).route == "code"


def test_head_saved_and_loaded(tmp_path):
    x = np.stack([unit(1, 0, 0), unit(0, 1, 0), unit(0.9, 0.1, 0), unit(0.1, 0.9, 0)])
    head = train_head(x, ["a", "b", "a", "b"], ["a", "b"], routes=["math", "code"])
    path = tmp_path / "h.npz"
    head.save(path)
    loaded = LinearHead.load(path)
    assert loaded.routes == ("math", "code")
    np.testing.assert_allclose(loaded.logits(x), head.logits(x), rtol=1e-6)
    clf = RouteClassifier(config(classifier={"method": "head", "head_path": str(path)}, default_threshold=0.5), encode)
    assert clf.classify(unit(1, 0, 0)).route == "math"


@pytest.mark.parametrize("hidden, batch", [(0, None), (16, 64)])
def test_a_head_trains_to_the_bits_torch_optims_adam_gives(monkeypatch, hidden, batch):
    import torch

    import router.head

    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 12)).astype(np.float32)
    labels = [f"c{i}" for i in rng.integers(0, 4, 300)]
    ours = train_head(x, labels, sorted(set(labels)), epochs=20, hidden=hidden, batch=batch)
    monkeypatch.setattr(router.head, "_Adam", lambda params, lr, weight_decay: torch.optim.Adam(
        params, lr=lr, weight_decay=weight_decay))
    theirs = train_head(x, labels, sorted(set(labels)), epochs=20, hidden=hidden, batch=batch)
    assert np.array_equal(ours.weight, theirs.weight) and np.array_equal(ours.bias, theirs.bias)
    if hidden:
        assert np.array_equal(ours.hidden_weight, theirs.hidden_weight)


def test_head_energy_rejects_a_prompt_that_only_leans_towards_a_class(tmp_path):
    # Softmax normalises strength away: a prompt mostly off every class still wins one with
    # probability near 1. The energy (log-sum-exp of the logits) keeps how strongly it matched.
    head = LinearHead(("a", "b"), ("math", "code"), np.asarray([[10, 0, 0], [0, 10, 0]], dtype=np.float32),
                      np.zeros(2, dtype=np.float32))
    head.save(tmp_path / "h.npz")
    strong, leaning = unit(1, 0, 0), unit(0.6, 0, 0.8)

    def classifier(score, threshold):
        return RouteClassifier(config(classifier={"method": "head", "head_path": str(tmp_path / "h.npz"),
                                                  "head_score": score}, default_threshold=threshold), encode)

    probability, energy = classifier("probability", 0.99), classifier("energy", 8.0)
    assert probability.classify(leaning).route == "math"  # p = 0.9975: the shortcoming
    assert energy.classify(leaning).reason == "default"
    assert energy.classify(strong).route == "math"
    scores = energy.scores(np.stack([strong, leaning]))
    # The top route scores the energy; another trails it by its logit gap (10 and 6 here).
    np.testing.assert_allclose(scores[:, 0], np.logaddexp([10.0, 6.0], 0.0), rtol=1e-5)
    np.testing.assert_allclose(scores[:, 0] - scores[:, 1], [10.0, 6.0], rtol=1e-5)
    assert energy.classify(strong).score == pytest.approx(10.0, abs=1e-3)


def test_head_with_wrong_routes_is_rejected(tmp_path):
    head = train_head(np.stack([unit(1, 0, 0), unit(0, 1, 0)]), ["x", "y"], ["x", "y"])
    head.save(tmp_path / "h.npz")
    with pytest.raises(ValueError, match="head routes"):
        RouteClassifier(config(classifier={"method": "head", "head_path": str(tmp_path / "h.npz")}), encode)


def test_head_of_another_encoders_dimension_is_rejected(tmp_path):
    # Fitted on 768-dimension embeddings, loaded beside a 3-dimension encoder: every score would be
    # garbage (or a shape error per request); refused at load, naming the key.
    head = LinearHead(("math", "code"), ("math", "code"), np.zeros((2, 768), dtype=np.float32), np.zeros(2, dtype=np.float32))
    head.save(tmp_path / "h.npz")
    with pytest.raises(ValueError, match="classifier.head_path: the head takes 768-dimension embeddings; the encoder gives 3"):
        RouteClassifier(config(classifier={"method": "head", "head_path": str(tmp_path / "h.npz")}), encode)


def routed(routes: list[str]) -> list[Decision]:
    return [Decision(r, r, 1.0, "matched") for r in routes]


def test_evaluate_metrics():
    r = evaluate(["math", "math", "code", "general"], routed(["math", "code", "code", "general"]),
                 ["math", "code", "general"], "general")
    assert r["accuracy"] == 0.75
    assert r["per_route"]["math"] == {"precision": 1.0, "recall": 0.5, "f1": 0.6667, "support": 2}
    assert r["per_route"]["code"]["precision"] == 0.5
    assert r["confusion"]["math"]["code"] == 1
    assert r["default_recall"] == 1.0 and r["in_scope_accuracy"] == 0.6667


def test_tuned_thresholds_never_lower_accuracy():
    rng = np.random.default_rng(0)
    cfg = config(default_threshold=0.95)
    clf = RouteClassifier(cfg, encode)
    centers = {"math": unit(1, 0, 0), "code": unit(0, 1, 0), "general": unit(0, 0, 1)}
    labels, xs = [], []
    for label, c in centers.items():
        xs += scatter(rng, c, 30, 0.35)
        labels += [label] * 30
    x = np.stack(xs).astype(np.float32)
    truth = np.asarray([{"math": 0, "code": 1}.get(label, -1) for label in labels])
    scores = clf.scores(x)
    before = np.mean(clf.choose(scores) == truth)
    th = tune_thresholds(clf, scores, truth, objective="accuracy")
    assert np.mean(clf.choose(scores, th) == truth) >= before
    result = fit(cfg, encode, x, labels)
    fitted = RouteClassifier(result.config, encode, head=result.head)  # the thresholds as written
    assert np.mean(fitted.choose(fitted.scores(x)) == truth) >= before


@pytest.mark.slow
def test_fit_refits_a_config_whose_thresholds_are_on_another_scale():
    # A config fitted with energy thresholds (above 1) fitted again: the probability candidate
    # must not inherit them (out of its range) and the result carries its own.
    rng = np.random.default_rng(2)
    x = np.stack(scatter(rng, unit(1, 0, 0), 20, 0.3) + scatter(rng, unit(0, 1, 0), 20, 0.3)).astype(np.float32)
    labels = ["math"] * 20 + ["code"] * 20
    energy = config(classifier={"method": "head", "head_score": "energy"}, default_threshold=7.0,
                    conversation={"gate": 9.0},
                    routes=[{"name": "math", "model": "math-model", "utterances": ["m1"], "threshold": 7.5},
                            {"name": "code", "model": "code-model", "utterances": ["c1"], "threshold": 6.25}])
    result = fit(energy, encode, x, labels, with_head=True, head_score="probability")
    assert result.config.classifier.head_score == "probability"
    assert all(0 <= r.threshold <= 1 for r in result.config.routes)
    # What fit does not tune is reset, not carried onto a scale where it means nothing (or is refused).
    assert result.config.default_threshold == 0.5 and result.config.conversation.gate is None
    assert any("conversation.gate 9.0 dropped" in note for note in result.notes)
    # On the same scale they stay as they were.
    same = fit(energy, encode, x, labels, with_head=True, head_score="energy")
    assert (same.config.default_threshold, same.config.conversation.gate) == (7.0, 9.0)


def test_the_shifted_objective_keeps_rejecting_when_default_traffic_is_rare_in_the_data():
    """Tuned on data with 3% default-route examples (CLINC150's val), plain accuracy barely cares
    about them; `shifted` (the default) weighs them as a fifth of the traffic."""
    rng = np.random.default_rng(1)
    clf = RouteClassifier(config(default_threshold=0.0), encode)
    centers = {"math": unit(1, 0, 0), "code": unit(0, 1, 0)}
    labels, xs = [], []
    for label, c in centers.items():
        xs += scatter(rng, c, 150, 0.45)
        labels += [label] * 150
    xs += scatter(rng, unit(1, 1, 2), 9, 0.2)  # out of scope: off both routes, scoring like their weaker examples
    labels += ["general"] * 9
    x = np.stack(xs).astype(np.float32)
    truth = np.asarray([{"math": 0, "code": 1}.get(label, -1) for label in labels])
    scores = clf.scores(x)

    def recall_and_shifted(th):
        hit = clf.choose(scores, th) == truth
        return hit[truth < 0].mean(), 0.8 * hit[truth >= 0].mean() + 0.2 * hit[truth < 0].mean()

    plain = recall_and_shifted(tune_thresholds(clf, scores, truth, objective="accuracy"))
    shifted = recall_and_shifted(tune_thresholds(clf, scores, truth))
    assert shifted[0] > plain[0]  # rejects more of the default route's traffic
    assert shifted[1] > plain[1]  # and is the better router once that traffic is a fifth of all


def test_evaluate_reports_accuracy_at_a_shifted_default_share():
    r = evaluate(["math"] * 9 + ["general"], routed(["math"] * 9 + ["math"]), ["math", "general"], "general")
    assert r["accuracy"] == 0.9
    assert r["shifted"] == {"default_share": 0.2, "accuracy": 0.8}


@pytest.mark.slow
def test_a_head_with_a_hidden_layer_learns_what_a_linear_one_cannot_and_saves_whole(tmp_path):
    from router.head import LinearHead, train_head

    # XOR of two features: no linear head separates it; one hidden layer does.
    rng = np.random.default_rng(0)
    x = rng.choice([-1.0, 1.0], size=(400, 2)).astype(np.float32)
    x += rng.normal(0, 0.1, size=x.shape).astype(np.float32)
    labels = ["same" if a * b > 0 else "differ" for a, b in x]
    linear = train_head(x, labels, ["differ", "same"])
    hidden = train_head(x, labels, ["differ", "same"], hidden=16, epochs=400)
    right = np.asarray([c == "same" for c in labels])
    assert ((linear.logits(x).argmax(axis=1) == 1) == right).mean() < 0.8
    assert ((hidden.logits(x).argmax(axis=1) == 1) == right).mean() > 0.95
    assert hidden.dimension == 2 and hidden.hidden_weight.shape == (16, 2)
    hidden.save(tmp_path / "h.npz")
    loaded = LinearHead.load(tmp_path / "h.npz")
    assert np.allclose(loaded.logits(x), hidden.logits(x), atol=1e-5)
    # A soft target moves the head towards the teacher's distribution, not only the labels.
    teacher = np.tile([[0.5, 0.5]], (len(x), 1))
    soft = train_head(x, labels, ["differ", "same"], hidden=16, epochs=400, soft=teacher)
    p = np.exp(soft.logits(x))
    p /= p.sum(axis=1, keepdims=True)
    assert np.abs(p - 0.5).max() < 0.2
