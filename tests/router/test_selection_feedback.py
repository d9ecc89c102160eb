"""Selection feedback: signed ids a client cannot forge or replay, corrections that follow what scores
say (slowly on little evidence), exploration that is bounded and counted, and a model whose answers
got worse losing its traffic."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import yaml

from esr_config import load_config
from esr_settings import ConfigError
from router.config import SelectionConfig, SelectionFeedbackConfig
from router.feedback import BadFeedback, FeedbackBook, SelectionIds, parse_feedback
from router.rules import RequestFacts
from router.selection import Feedback, QualityModel, Selector, feedback_for
from tests.support import ROOT

TOKEN = b"a-feedback-token-of-some-length"


def test_an_id_names_its_request_and_is_refused_when_forged_old_or_scored_twice():
    now = [1000.0]
    ids = SelectionIds(TOKEN, max_age_s=60, clock=lambda: now[0])
    sid = ids.issue("math.route", ("big", "small/model:v1"), [0.9, 0.8125], 1)
    issued = ids.verify(sid)
    assert (issued.route, issued.model, issued.predicted) == ("math.route", "small/model:v1", 0.8125)
    assert issued.selected == "small/model:v1"
    with pytest.raises(BadFeedback) as again:
        ids.verify(sid)
    assert again.value.kind == "repeated"
    body, _, mac = ids.issue("math", ("big", "small"), [0.5, 0.4], 0).rpartition(".")
    parts = body.split(".")
    forged = ".".join([*parts[:2], "9999,4000", *parts[3:]]) + "." + mac  # another prediction, the old MAC
    with pytest.raises(BadFeedback) as bad:
        ids.verify(forged)
    assert bad.value.kind == "bad_id"
    assert SelectionIds(b"another-token-entirely", 60).verify is not None
    with pytest.raises(BadFeedback) as other:  # another router's secret
        SelectionIds(b"another-token-entirely", 60).verify(ids.issue("math", ("big", "small"), [0.5, 0.4], 0))
    assert other.value.kind == "bad_id"
    old = ids.issue("math", ("big", "small"), [0.5, 0.4], 0)
    now[0] += 61
    with pytest.raises(BadFeedback) as expired:
        ids.verify(old)
    assert expired.value.kind == "expired"


def test_a_score_counts_for_the_model_that_answered_which_envoy_appends_after_a_failover():
    ids = SelectionIds(TOKEN, max_age_s=60)
    sid = ids.issue("math", ("cheap", "dear", "dearest"), [0.8, 0.9, 0.95], 0)
    served = ids.verify(f"{sid}~dear")  # cheap failed; dear answered
    assert (served.model, served.selected) == ("dear", "cheap") and served.predicted == pytest.approx(0.9, abs=5e-4)
    with pytest.raises(BadFeedback) as again:  # one score per request, whichever model it names
        ids.verify(f"{sid}~dearest")
    assert again.value.kind == "repeated"
    assert ids.verify(ids.issue("math", ("cheap", "dear"), [0.8, 0.9], 1)).model == "dear"  # as set: the selected
    for other in ("general", "", "-"):  # a model the id does not name, or none (Envoy answered itself)
        with pytest.raises(BadFeedback) as refused:
            ids.verify(ids.issue("math", ("cheap", "dear"), [0.8, 0.9], 0) + "~" + other)
        assert refused.value.kind == "unattributed"


@pytest.mark.parametrize("body", [[], {"selection_id": 3, "score": 1}, {"selection_id": "x", "score": 1.5},
                                  {"selection_id": "x", "score": True}, {"selection_id": "x", "score": float("nan")},
                                  {"selection_id": "", "score": 0.5}, {"score": 0.5}])
def test_a_feedback_body_is_an_id_and_a_score_in_0_1(body):
    with pytest.raises(BadFeedback) as bad:
        parse_feedback(body)
    assert bad.value.kind == "bad_body"
    assert parse_feedback({"selection_id": "x", "score": 1}) == ("x", 1.0)


def test_a_correction_grows_with_the_evidence_and_forgets_the_old():
    book = FeedbackBook(half_life=50, prior=20)
    assert book.corrections("r", ("a", "b")) is None
    book.add("r", "a", 0.8, 0.4)
    one = book.correction("r", "a")
    assert -0.4 < one < 0 and book.correction("r", "b") == 0.0  # one score moves it a little
    for _ in range(200):
        book.add("r", "a", 0.8, 0.4)
    # much evidence: most of it (the window holds ~1.44 half-lives of scores, still shrunk by the prior)
    assert -0.4 < book.correction("r", "a") < -0.3
    for _ in range(300):  # the model recovered: the past fades
        book.add("r", "a", 0.8, 0.8)
    assert abs(book.correction("r", "a")) < 0.02
    assert book.correction("other", "a") == 0.0  # per route


def _selector(explore: float = 0.0, draws=None) -> Selector:
    quality = QualityModel(("cheap", "dear"), np.array([[0.0, 0.85], [0.0, 0.95]]), np.array([0.05, 0.05]), 0.1)
    feedback = Feedback(FeedbackBook(half_life=200, prior=20), SelectionIds(TOKEN, 3600), explore, "/fb", TOKEN,
                        draw=(lambda: next(draws)) if draws is not None else random.random)
    return Selector(quality, "cheapest_meeting_floor", {"cheap": 1.0, "dear": 20.0}, 0.75, None, 0.0, feedback)


def test_scores_under_the_prediction_move_traffic_off_a_model_and_ids_carry_the_choice():
    selector = _selector()
    v = np.zeros(1)
    first = selector.order(("dear", "cheap"), v, "math")
    assert first.models == ("cheap", "dear") and first.selection_id is not None and not first.explored
    issued = selector.feedback.ids.verify(first.selection_id)
    assert (issued.route, issued.model, issued.predicted) == ("math", "cheap", pytest.approx(0.85, abs=5e-4))
    for _ in range(40):  # cheap's answers on this route score 0.5, not 0.85
        selector.feedback.book.add("math", "cheap", 0.85, 0.5)
    assert selector.order(("dear", "cheap"), v, "math").models == ("dear", "cheap")
    assert selector.order(("dear", "cheap"), v, "chat").models == ("cheap", "dear")  # other routes keep it


def test_exploration_sends_the_stated_share_elsewhere_and_says_so():
    draws = itertools.cycle([0.01, 0.5, 0.5])  # explore (0.01 < 0.02), pick; then two that do not
    selector = _selector(explore=0.02, draws=draws)
    v = np.zeros(1)
    explored = selector.order(("dear", "cheap"), v, "math")
    assert explored.explored and explored.models == ("dear", "cheap")
    issued = selector.feedback.ids.verify(explored.selection_id)
    assert issued.model == "dear"  # its score is the explored model's
    plain = selector.order(("dear", "cheap"), v, "math")
    assert not plain.explored and plain.models[0] == "cheap"
    rate = _selector(explore=0.05)
    share = np.mean([rate.order(("dear", "cheap"), v, "r").explored for _ in range(20000)])
    assert 0.04 < share < 0.06


def test_a_model_whose_scores_halve_loses_half_its_traffic_within_2000_requests():
    rng = np.random.default_rng(0)
    selector = _selector(explore=0.02)
    v = np.zeros(1)
    served, dropped_at = [], 2000
    for i in range(6000):
        chosen = selector.order(("dear", "cheap"), v, "math")
        model = chosen.models[0]
        true = {"cheap": 0.85, "dear": 0.95}[model]
        if model == "cheap" and i >= dropped_at:
            true /= 2
        score = float(np.clip(true + 0.1 * rng.standard_normal(), 0, 1))
        issued = selector.feedback.ids.verify(chosen.selection_id)
        selector.feedback.book.add(issued.route, issued.model, issued.predicted, score)
        served.append(model == "cheap")
    before = np.mean(served[dropped_at - 1000:dropped_at])
    after = np.mean(served[dropped_at + 1000:dropped_at + 2000])
    assert before > 0.95 and after <= before / 2, (before, after)
    recovered = np.mean(served[-1000:])
    assert recovered < 0.1  # still off it, explored now and then (2%) to notice if it recovers


def _selection(**feedback) -> SelectionConfig:
    return SelectionConfig(path="q.npz", feedback=SelectionFeedbackConfig(enabled=True, **feedback))


def test_feedback_needs_a_token_of_some_length_named_by_the_key(monkeypatch):
    monkeypatch.delenv("SEMANTIC_ROUTER_FEEDBACK_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="selection.feedback.token_env: set SEMANTIC_ROUTER_FEEDBACK_TOKEN"):
        feedback_for(_selection())
    monkeypatch.setenv("SEMANTIC_ROUTER_FEEDBACK_TOKEN", "short")
    with pytest.raises(ConfigError):
        feedback_for(_selection())
    monkeypatch.setenv("SEMANTIC_ROUTER_FEEDBACK_TOKEN", TOKEN.decode() + "\n")  # as a mounted secret often ends
    feedback = feedback_for(_selection())
    assert feedback.authorized(f"Bearer {TOKEN.decode()}") and not feedback.authorized("Bearer nope")
    assert not feedback.authorized(TOKEN.decode()) and feedback_for(SelectionConfig()) is None


def test_a_reload_keeps_what_still_applies(monkeypatch):
    monkeypatch.setenv("SEMANTIC_ROUTER_FEEDBACK_TOKEN", TOKEN.decode())
    first = feedback_for(_selection())
    sid = first.ids.issue("math", ("cheap", "dear"), [0.8, 0.9], 0)
    first.ids.verify(sid)
    first.book.add("math", "cheap", 0.8, 0.4)
    same = feedback_for(_selection(), first)
    assert same.book is first.book and same.ids is first.ids
    with pytest.raises(BadFeedback) as again:  # scored before the reload: still scored
        same.ids.verify(sid)
    assert again.value.kind == "repeated"
    retuned = feedback_for(_selection(half_life=50), first)  # other corrections: begun afresh
    assert retuned.book is not first.book and retuned.ids is first.ids
    monkeypatch.setenv("SEMANTIC_ROUTER_FEEDBACK_TOKEN", "another-token-entirely-0")
    assert feedback_for(_selection(), first).ids is not first.ids  # another secret: its own ids


def test_an_id_that_cannot_be_ours_is_refused_not_raised(monkeypatch):
    import router.feedback as feedback_module

    ids = SelectionIds(TOKEN, 3600)
    for odd in ("caf\u00e9.x", "\ud800", "a.b.c", ".", ""):
        with pytest.raises(BadFeedback) as bad:
            ids.verify(odd)
        assert bad.value.kind == "bad_id"
    for body in ("bm90.YQ.notanumber.0.1.AAAA", "bm90.YQ.5000.3.1.AAAA"):  # signed, but not as issue() writes
        with pytest.raises(BadFeedback) as bad:
            ids.verify(f"{body}.{ids._mac(body)}")
        assert bad.value.kind == "bad_id"
    monkeypatch.setattr(feedback_module, "SEEN", 2)  # a short memory: what it forgot is refused as old
    old = [ids.issue("r", ("m", "n"), [0.5, 0.6], 0) for _ in range(3)]
    for sid in old:
        ids.verify(sid)
    with pytest.raises(BadFeedback) as forgotten:
        ids.verify(old[0])
    assert forgotten.value.kind in ("expired", "repeated")


def test_corrections_reach_the_models_whole_error():
    selector = _selector()
    selector.floor = 0.0  # the cheap model always meets it: every score is its
    v = np.zeros(1)
    for _ in range(2000):  # cheap is predicted 0.85 and scores 0.55: an error of 0.30
        chosen = selector.order(("cheap",) + ("dear",), v, "math")
        issued = selector.feedback.ids.verify(chosen.selection_id)
        truth = 0.55 if issued.model == "cheap" else 0.95
        selector.feedback.book.add(issued.route, issued.model, issued.predicted, truth)
    correction = selector.feedback.book.correction("math", "cheap")
    assert -0.30 <= correction < -0.26, correction  # all of it, less the prior's shrinkage (~7%)


@pytest.mark.parametrize("selection, key", [
    ({"feedback": {"explore": 0.5}}, "selection.feedback.explore"),
    ({"feedback": {"enabled": True}}, "selection.feedback.enabled"),  # no quality model to correct
    ({"route_floors": {"lgeal": 0.9}}, "selection.route_floors.lgeal"),  # no such route
])
def test_a_bad_selection_key_is_named_in_full(tmp_path, selection, key):
    config = yaml.safe_load((ROOT / "router.yaml").read_text())
    config["selection"] = selection
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match=key):
        load_config(tmp_path / "c.yaml")


def test_offline_decisions_take_no_feedback_and_need_no_token(tmp_path, monkeypatch):
    from esr_config import parse_config
    from esr_tuning.decide import decide_requests
    from router.selection import save_quality

    monkeypatch.delenv("SEMANTIC_ROUTER_FEEDBACK_TOKEN", raising=False)
    weights = np.zeros((2, 385), np.float32)
    save_quality(QualityModel(("math-model", "general-model"), weights, np.zeros(2, np.float32), 0.1),
                 str(tmp_path / "q.npz"), "bundled:all-MiniLM-L6-v2")
    config = parse_config({
        "routes": [{"name": "math", "models": ["math-model", "general-model"], "keywords": ["integral"],
                    "utterances": ["solve for x"]}],
        "default_route": {"name": "general", "model": "general-model"},
        "selection": {"path": str(tmp_path / "q.npz"), "prices": {"math-model": 5, "general-model": 1},
                      "feedback": {"enabled": True}}})
    decided = decide_requests(config, None, [(("an integral",), RequestFacts())], {})
    assert decided[0].route == "math" and decided[0].selection_id is None


def test_a_route_may_hold_its_own_floor():
    quality = QualityModel(("cheap", "dear"), np.array([[0.0, 0.85], [0.0, 0.95]]), np.array([0.05, 0.05]), 0.1)
    selector = Selector(quality, "cheapest_meeting_floor", {"cheap": 1.0, "dear": 20.0}, 0.75, None, 0.0,
                        route_floors={"legal": 0.9})
    v = np.zeros(1)
    assert selector.order(("dear", "cheap"), v, "chat").models[0] == "cheap"  # 0.80 meets 0.75
    assert selector.order(("dear", "cheap"), v, "legal").models[0] == "dear"  # 0.80 does not meet 0.9
