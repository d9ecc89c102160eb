"""Model selection: score rows read as a matrix, the synthetic matrix, the quality model's calibrated
margins, each strategy's order, and `select-fit` from rows to a config that serves it."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from esr_config import load_config
from esr_tuning.score_matrix import ScoreRow, matrix, read_rows, synthetic, write_rows
from esr_tuning.selection_fit import fit_quality, margins
from router.selection import QualityModel, Selector, load_quality, rank, save_quality
from tests.support import ROOT


def test_rows_read_as_a_matrix_of_prompts_every_model_scored(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "a", "model": "x", "score": 0.5, "cost": 2.0},
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "a"}]}],
         "model": "y", "score": 1},  # content parts read as the server reads them
        {"prompt": "b", "model": "x", "score": 0.25, "cost": 4.0},  # y never scored b: b is dropped
    ]) + "\n")
    m = matrix(read_rows(path), prices={"y": 7.0})
    assert m.prompts == ["a"] and m.models == ["x", "y"]
    assert m.scores.tolist() == [[0.5, 1.0]] and m.costs.tolist() == [3.0, 7.0]
    path.write_text(json.dumps({"prompt": "a", "model": "x", "score": 1.5}) + "\n")
    with pytest.raises(ValueError, match=r"rows.jsonl:1: score 1.5 is not in \[0, 1\]"):
        read_rows(path)
    path.write_text(json.dumps({"prompt": "a", "model": "x", "score": 1, "cost": 0}) + "\n")
    with pytest.raises(ValueError, match=r"rows.jsonl:1: cost 0 is not positive"):
        read_rows(path)


def test_the_synthetic_matrix_is_seeded_and_dearer_models_score_higher():
    texts = [f"prompt {i}" for i in range(400)]
    domains, intents = [f"d{i % 5}" for i in range(400)], [f"i{i % 20}" for i in range(400)]
    rows = synthetic(texts, domains, intents, seed=3)
    assert rows == synthetic(texts, domains, intents, seed=3) and rows != synthetic(texts, domains, intents, seed=4)
    m = matrix(rows)
    assert m.costs.max() / m.costs.min() == 50
    means = m.scores.mean(axis=0)
    assert list(np.argsort(means)) == list(np.argsort(m.costs))
    # no model is best everywhere: a cheaper one beats a dearer one on some prompts
    assert (m.scores[:, 0] > m.scores[:, -1]).any()


def _domain_data(n: int, seed: int):
    """Vectors that show a prompt's domain (one-hot plus noise); scores by domain plus noise."""
    rng = np.random.default_rng(seed)
    domain = rng.integers(0, 4, n)
    x = np.eye(4)[domain] + 0.1 * rng.standard_normal((n, 4))
    level = np.array([[0.9, 0.2, 0.6, 0.4], [0.95, 0.9, 0.9, 0.85]])  # (models, domains)
    y = np.clip(level[:, domain].T + 0.1 * rng.standard_normal((n, 2)), 0, 1)
    return x, y


def test_margins_hold_the_stated_rate_on_new_prompts():
    x, y = _domain_data(4000, 0)
    quality = fit_quality(["cheap", "dear"], x, y, alpha=0.1, l2=0.1)
    x_new, y_new = _domain_data(4000, 1)
    under = (y_new < quality.predict(x_new) - quality.margins).mean(axis=0)
    assert (under <= 0.1 + 0.02).all() and (under >= 0.1 - 0.04).all(), under
    assert margins(np.zeros((9, 1)), np.zeros((9, 1)), 0.1).tolist() == [0.0]


def test_each_strategy_orders_the_models_and_the_failover_chain_follows():
    quality = QualityModel(("nano", "mid", "big"), np.array([[0.0, 0.70], [0.0, 0.85], [0.0, 0.95]]),
                           np.array([0.05, 0.05, 0.05]), 0.1)
    prices = {"nano": 1.0, "mid": 5.0, "big": 30.0}
    v = np.zeros(1)
    floor = Selector(quality, "cheapest_meeting_floor", prices, 0.78, None, 0.0)
    assert floor.order(("big", "mid", "nano"), v).models == ("mid", "big", "nano")  # meet the floor cheapest first
    picked = floor.order(("big", "mid", "nano", "unknown"), v)
    assert picked.models[-1] == "unknown" and (picked.quality, picked.price) == (pytest.approx(0.85), 5.0)
    none_meet = Selector(quality, "cheapest_meeting_floor", prices, 0.99, None, 0.0)
    assert none_meet.order(("nano", "mid", "big"), v).models == ("big", "mid", "nano")  # surest first
    budget = Selector(quality, "best_within_budget", prices, 0.8, 6.0, 0.0)
    assert budget.order(("nano", "mid", "big"), v).models == ("mid", "nano", "big")
    broke = Selector(quality, "best_within_budget", prices, 0.8, 0.5, 0.0)  # none within: the cheapest
    assert broke.order(("big", "mid", "nano"), v).models == ("nano", "mid", "big")
    # utility weighs price against the quality model's cheapest, whichever models a route has
    assert Selector(quality, "utility", prices, 0.8, None, 0.0025).order(("mid", "big"), v).models == ("big", "mid")
    with pytest.raises(ValueError, match=r"selection.prices: no price for \['big'\]"):
        Selector(quality, "utility", {"nano": 1.0, "mid": 5.0}, 0.8, None, 0.0)
    assert Selector(quality, "utility", prices, 0.8, None, 0.001).order(("nano", "big"), v).models == ("big", "nano")
    assert Selector(quality, "utility", prices, 0.8, None, 0.1).order(("nano", "big"), v).models == ("nano", "big")
    assert floor.order(("mid", "other"), v) is None  # one known model: nothing to choose between
    predicted = np.array([[0.70, 0.85, 0.95]])
    assert rank("cheapest_meeting_floor", predicted[0], quality.margins, np.array([1.0, 5.0, 30.0]), 0.78)[0] == 1


def test_a_quality_model_file_is_refused_by_the_key_when_it_does_not_fit(tmp_path):
    quality = QualityModel(("a", "b"), np.zeros((2, 5)), np.zeros(2), 0.1)
    save_quality(quality, str(tmp_path / "q.npz"), "bundled:all-MiniLM-L6-v2")
    assert load_quality(str(tmp_path / "q.npz")).models == ("a", "b")
    with pytest.raises(ValueError, match="selection.path: .* 4 dimensions, the encoder's have 384"):
        load_quality(str(tmp_path / "q.npz"), dimension=384)
    (tmp_path / "bad.npz").write_bytes(b"not a file of arrays")
    with pytest.raises(ValueError, match="selection.path: .* is not a quality model"):
        load_quality(str(tmp_path / "bad.npz"))


def _five_models(tmp_path, per_topic: int, seed: int):
    """A config whose routes rank the synthetic matrix's five models, and its rows over three topics."""
    config = tmp_path / "router.yaml"
    config.write_text(json.dumps({
        "routes": [{"name": "math", "models": ["frontier", "large", "small", "nano"], "utterances": ["solve 2x = 4"]}],
        "default_route": {"name": "general", "models": ["frontier", "medium", "nano"]}}))
    texts = [f"question {i} about {t}" for i in range(per_topic) for t in ("algebra", "travel", "cooking")]
    topics = [t.rsplit(" ", 1)[1] for t in texts]
    return config, synthetic(texts, topics, topics, seed=seed)


@pytest.mark.processes
def test_select_fit_writes_a_config_that_serves_the_quality_model(tmp_path):
    config, rows = _five_models(tmp_path, 60, seed=1)
    write_rows(rows, tmp_path / "rows.jsonl")
    done = subprocess.run([sys.executable, "-m", "esr_app", "select-fit", "--config", str(config), "--rows",
                           str(tmp_path / "rows.jsonl"), "--out", str(tmp_path / "fitted.yaml"), "--floor", "0.6"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    fitted = load_config(tmp_path / "fitted.yaml")
    assert fitted.selection.path == str(tmp_path / "fitted.quality.npz") and fitted.selection.quality_floor == 0.6
    assert fitted.selection.prices == {"nano": 1.0, "small": 3.0, "medium": 8.0, "large": 20.0, "frontier": 50.0}
    assert "selection.path: fitted.quality.npz" in done.stdout or "fitted.quality.npz" in done.stdout
    assert load_quality(fitted.selection.path, dimension=384).models == ("nano", "small", "medium", "large", "frontier")
    wrong = tmp_path / "wrong.jsonl"
    write_rows([ScoreRow("q", "not-a-model", 0.5)], wrong)
    refused = subprocess.run([sys.executable, "-m", "esr_app", "select-fit", "--config", str(config), "--rows", str(wrong),
                              "--out", str(tmp_path / "x.yaml")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "not-a-model" in refused.stderr


@pytest.mark.processes
def test_where_the_static_tier_decides_selection_predicts_from_its_vectors(tmp_path):
    """select-fit on a config whose static tier serves fits a second predictor on the static vectors;
    the served decision the static tier makes is then selected from them (no transformer work)."""
    import yaml

    from esr_app.routing_build import static_tier
    from esr_tuning.decide import decide_requests
    from router.rules import RequestFacts

    raw = yaml.safe_load((ROOT / "router.yaml").read_text())
    math = next(r for r in raw["routes"] if r["name"] == "math")
    math["models"] = ["math-model", "general-model"]
    (tmp_path / "router.yaml").write_text(yaml.safe_dump(raw))
    config = load_config(tmp_path / "router.yaml")
    tier = static_tier(config)
    assert tier is not None, "router.yaml's static tier serves"
    texts = [f"{t} number {i}" for i in range(40) for t in ("solve the integral of x squared", "hello there friend")]
    rows = [ScoreRow(t, m, s, c) for t in texts for m, s, c in (("math-model", 0.9, 10.0), ("general-model", 0.8, 1.0),
                                                                  ("code-model", 0.5, 5.0))]
    write_rows(rows, tmp_path / "rows.jsonl")
    done = subprocess.run([sys.executable, "-m", "esr_app", "select-fit", "--config", str(tmp_path / "router.yaml"),
                           "--rows", str(tmp_path / "rows.jsonl"), "--out", str(tmp_path / "fitted.yaml"), "--floor",
                           "0.7"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    fitted = load_config(tmp_path / "fitted.yaml")
    quality = load_quality(fitted.selection.path)
    static_dimension = tier.encode(["x"]).shape[-1]
    assert quality.static is not None and quality.static.weights.shape == (3, static_dimension + 1)
    # A prompt the static tier decides for math: selection chose (predicted score and price set),
    # the cheaper general-model meeting the floor.
    prompt = "solve the integral of x squared"
    assert static_tier(fitted).decide([prompt]) is not None, "the static tier decides this prompt"
    decided = decide_requests(fitted, None, [((prompt,), RequestFacts())], {}, static_tier(fitted))[0]
    assert decided.tier == "static" and decided.route == "math"
    assert decided.predicted_quality is not None, decided
    assert decided.model == "general-model" and decided.predicted_quality == pytest.approx(0.8, abs=0.05), decided


@pytest.mark.processes
def test_select_eval_draws_the_quality_cost_curve_against_single_models_and_the_oracle(tmp_path):
    from html.parser import HTMLParser

    config, rows = _five_models(tmp_path, 80, seed=2)
    fit_rows, held_out = [r for r in rows if int(r.prompt.split()[1]) < 50], [r for r in rows if int(r.prompt.split()[1]) >= 50]
    write_rows(fit_rows, tmp_path / "fit.jsonl")
    write_rows(held_out, tmp_path / "held.jsonl")
    run = [sys.executable, "-m", "esr_app"]
    fitted = subprocess.run([*run, "select-fit", "--config", str(config), "--rows", str(tmp_path / "fit.jsonl"),
                             "--out", str(tmp_path / "fitted.yaml"), "--floor", "0.6"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert fitted.returncode == 0, fitted.stderr
    judged = subprocess.run([*run, "select-eval", "--config", str(tmp_path / "fitted.yaml"), "--rows",
                             str(tmp_path / "held.jsonl"), "--html", str(tmp_path / "curve.html"), "--json"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert judged.returncode == 0, judged.stderr
    report = json.loads(judged.stdout)
    assert report["models"] == ["nano", "small", "medium", "large", "frontier"]
    costs = [c for c, _ in report["curve"]]
    assert costs == sorted(costs) and report["policy"]["strategy"] == "cheapest_meeting_floor"
    # the oracle bounds any predictor: at the top of the curve it scores at least as well
    assert report["oracle_curve"][-1][1] >= report["curve"][-1][1]

    class Shapes(HTMLParser):
        def __init__(self):
            super().__init__()
            self.seen: list[tuple[str, str]] = []

        def handle_starttag(self, tag, attrs):
            self.seen.append((tag, dict(attrs).get("class", "")))

    shapes = Shapes()
    shapes.feed((tmp_path / "curve.html").read_text())
    assert {("polyline", "router"), ("polyline", "oracle"), ("polyline", "mix"), ("rect", "policy")} <= set(shapes.seen)
    assert shapes.seen.count(("circle", "model")) == 5
    refused = subprocess.run([*run, "select-eval", "--config", str(config), "--rows", str(tmp_path / "held.jsonl")],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "selection.path is not set" in refused.stderr


def test_scores_feedback_recorded_join_their_requests_records_as_rows(tmp_path):
    from esr_tuning.feedback_rows import feedback_rows
    from esr_tuning.replay import read_records

    lines = [
        {"route": "math", "model": "cheap", "reason": "matched", "confidence": 0.9, "selection_id": "a.1",
         "texts": ["hello", "solve 2x = 4"]},
        {"kind": "score", "selection_id": "a.1", "route": "math", "model": "dear", "selected": "cheap", "score": 0.4},
        {"kind": "score", "selection_id": "a.1", "route": "math", "model": "dear", "selected": "cheap", "score": 0.9},
        {"kind": "score", "selection_id": "b.2", "route": "math", "model": "cheap", "selected": "cheap", "score": 1.0},
        {"route": "math", "model": "cheap", "reason": "matched", "confidence": 0.9, "selection_id": "c.3"},
        {"kind": "score", "selection_id": "c.3", "route": "math", "model": "cheap", "selected": "cheap", "score": 0.2},
    ]
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"kind": "score", "selection_id": "x.9"\n')
    rows, counts = feedback_rows([path])
    # the model that answered (after a failover, not the selected one), on the request's newest text
    assert rows == [ScoreRow("solve 2x = 4", "dear", 0.4)]
    assert counts == {"joined": 1, "repeated": 1, "no_request": 1, "no_texts": 1, "malformed": 1}
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    records, left_out = read_records(path)  # replay and the refit leave the scores out, counted
    assert len(records) == 1 and left_out["score"] == 4


def test_a_model_scored_on_some_prompts_only_learns_from_those():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(400, 8))
    scores = np.column_stack([np.full(400, 0.9), np.full(400, np.nan)])
    scores[::2, 1] = 0.3  # the second model scored on half the prompts
    quality = fit_quality(["a", "b"], vectors, scores, alpha=0.1)
    predicted = quality.weights[:, :-1] @ vectors[1] + quality.weights[:, -1]
    assert predicted == pytest.approx([0.9, 0.3], abs=0.02)
    assert np.all(np.isfinite(quality.margins))
    scores[:, 1] = np.nan
    scores[0, 1] = 0.3  # scored once: nothing to calibrate its margin on
    with pytest.raises(ValueError, match="b: scored on 1 prompts"):
        fit_quality(["a", "b"], vectors, scores, alpha=0.1)
