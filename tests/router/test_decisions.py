"""Rules, keywords, set_body and calibrated confidence: config checks, matching, and the offline fit."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from esr_extproc.json_scan import with_members
from esr_extproc.request_body import ReadOptions, parse_body
from router.llm_body import capped, estimate_tokens, request_facts
from router.calibration import Calibrator, CalibrationConfig
from router.classifier import RouteClassifier
from esr_config import ConfigError, parse_config
from router.rules import RequestFacts, Rules
from tests.support.fakes import encode, unit
from esr_tuning.calibration import Examples, calibrate, fit_logistic, reliability

CHAT = "/v1/chat/completions"


def config(**over):
    base = {
        "routes": [
            {"name": "math", "model": "math-model", "utterances": ["m1", "m2", "m3"]},
            {"name": "code", "model": "code-model", "utterances": ["c1", "c2"], "keywords": ["kubectl", "helm chart"]},
            {"name": "long", "model": "general-model"},
        ],
        "default_route": {"name": "general", "model": "general-model"},
        "default_threshold": 0.8,
        "rules": [{"when": {"min_prompt_tokens": 100}, "route": "long"},
                  {"when": {"has_images": True, "keywords": ["diagram"]}, "route": "math"}],
    }
    base.update(over)
    return parse_config(base)


def test_rules_first_then_keywords_then_nothing():
    rules = Rules(config())
    assert rules.decide("anything", RequestFacts(prompt_tokens=150)).route == "long"
    assert rules.decide("Run KUBECTL get pods", RequestFacts(prompt_tokens=5)).reason == "keyword"
    assert rules.decide("my Helm   chart fails", RequestFacts()).route == "code"  # a phrase, any spacing
    assert rules.decide("kubectlx and helmchart", RequestFacts()) is None  # whole words only
    assert rules.decide("the diagram", RequestFacts(has_images=True)).route == "math"
    assert rules.decide("the diagram", RequestFacts(has_images=False)) is None  # every condition must hold
    assert rules.decide("kubectl", RequestFacts(prompt_tokens=100)).reason == "rule"  # rules come first


def test_a_route_with_no_utterances_is_never_the_models_choice():
    clf = RouteClassifier(config(), encode)
    scores = clf.scores(np.stack([unit(1, 0, 0), unit(0, 0, 1)]))
    assert np.isneginf(scores[:, 2]).all()
    assert [clf.decision(row, int(i)).route for row, i in zip(scores, clf.choose(scores))] == ["math", "general"]


@pytest.mark.parametrize("change, key", [
    ({"rules": [{"when": {"min_prompt_tokens": 5}, "route": "nowhere"}]}, "rules[0].route"),
    ({"rules": [{"when": {}, "route": "math"}]}, "rules[0].when"),
    ({"rules": [{"when": {"min_prompt_tokens": 9, "max_prompt_tokens": 3}, "route": "math"}]},
     "rules[0].when.max_prompt_tokens"),
    ({"rules": []}, "routes[2].utterances"),  # "long" is now reachable by nothing
    ({"min_confidence": 1.5}, "min_confidence"),
])
def test_bad_rules_are_refused_naming_the_key(change, key):
    with pytest.raises(ConfigError, match="^config: " + re.escape(key)):
        parse_config({**_raw(), **change}, "config")


def test_set_body_may_not_touch_the_model_or_the_prompt():
    raw = _raw()
    raw["routes"][0]["set_body"] = {"messages": []}
    with pytest.raises(ConfigError, match=r"routes\[0\]\.set_body\.messages"):
        parse_config(raw, "config")
    raw["routes"][0]["set_body"] = {"reasoning_effort": float("nan")}
    with pytest.raises(ConfigError, match=r"routes\[0\]\.set_body\.reasoning_effort"):
        parse_config(raw, "config")


def _raw():
    return {"routes": [{"name": "math", "model": "m", "utterances": ["m1"]},
                       {"name": "code", "model": "c", "utterances": ["c1"]},
                       {"name": "long", "model": "g"}],
            "default_route": {"name": "general", "model": "g"},
            "rules": [{"when": {"min_prompt_tokens": 5}, "route": "long"}]}


def test_with_members_replaces_and_adds_keeping_every_other_byte():
    raw = b'{"model" : "auto", "n":1E2, "reasoning_effort":"low",\n "messages":[{"role":"user","content":"\\ud800"}]}'
    parsed = parse_body(raw, CHAT)
    out = with_members(raw, {"model": (parsed.model_span, "m"),
                             "reasoning_effort": (parsed.data.byte_span("reasoning_effort"), "high"),
                             "top_k": (None, 3)})
    assert out == (b'{"top_k":3,"model" : "m", "n":1E2, "reasoning_effort":"high",\n'
                   b' "messages":[{"role":"user","content":"\\ud800"}]}')
    json.loads(out)


def test_request_facts_count_every_role_and_see_tools_and_images():
    body = {"messages": [{"role": "system", "content": "word " * 300},
                         {"role": "user", "content": [{"type": "text", "text": "look"},
                                                      {"type": "image_url", "image_url": {"url": "data:,"}}]}],
            "tools": [{"type": "function", "function": {"name": "f"}}]}
    facts = request_facts(body, CHAT)
    assert facts.prompt_tokens >= 300 and facts.has_tools and facts.has_images
    assert request_facts({"messages": [], "tools": []}, CHAT) == RequestFacts(0, False, False)
    assert estimate_tokens("a b c") == 3 and estimate_tokens("x" * 40) == 10


def test_capped_keeps_the_part_it_is_told_to():
    text = "START " + "x" * 100 + " END"
    assert capped(text, 20, "head").startswith("START") and len(capped(text, 20, "head")) == 20
    assert capped(text, 20, "tail").endswith("END") and len(capped(text, 20, "tail")) == 20
    both = capped(text, 20, "ends")
    assert both.startswith("START") and both.endswith("END") and len(both) == 20
    parsed = parse_body(json.dumps({"messages": [{"role": "user", "content": text}]}).encode(), CHAT)
    assert not parsed.truncated
    from router.config import RequestsConfig
    assert parse_body(json.dumps({"messages": [{"role": "user", "content": text}]}).encode(), CHAT,
                      ReadOptions(RequestsConfig(prompt_max_tokens=8))).truncated


def test_logistic_calibration_recovers_probabilities_and_ranks():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (4000, 3))
    truth = 1 / (1 + np.exp(-(6 * x[:, 0] - 3)))
    right = rng.uniform(size=4000) < truth
    coef = fit_logistic(x, right.astype(float))
    assert abs(coef[1] - 6) < 0.8 and abs(coef[0] + 3) < 0.5 and abs(coef[2]) < 0.5
    c = Calibrator(CalibrationConfig(matched=coef))
    conf = [c.confidence("matched", row, 0.0) for row in x]
    measured = reliability(conf, right)
    assert measured["ece"] < 0.03 and measured["auroc"] > 0.75
    # a constant equal to the accuracy is calibrated and useless: AUROC 0.5
    flat = reliability([right.mean()] * len(right), right)
    assert flat["ece"] < 0.01 and flat["auroc"] == 0.5


def test_calibration_can_weigh_the_default_route_as_traffic_will():
    kinds = ["matched"] * 100 + ["default"] * 100
    right = np.asarray([True] * 90 + [False] * 10 + [True] * 50 + [False] * 50)
    in_scope = np.asarray([True] * 100 + [False] * 50 + [True] * 50)  # right defaults are out-of-scope prompts
    examples = Examples(kinds, np.zeros((200, 3)), right, in_scope)
    own = calibrate(examples, None)
    shifted = calibrate(examples, 0.5)  # out-of-scope weighs half: default decisions are more often right
    assert own.fallback == 0.25 and shifted.fallback == 0.5
    assert len(own.default) == len(shifted.default) == 4
    x = np.zeros(3)
    assert Calibrator(shifted).confidence("default", x, 0) > Calibrator(own).confidence("default", x, 0)


def test_uncalibrated_confidence_is_1_for_rules_and_a_prior_on_fallbacks():
    clf = RouteClassifier(config(calibration={"matched": [0.9], "default": [0.2], "fallback": 0.07}), encode)
    assert clf.default("fallback_timeout").confidence == 0.07
    assert clf.classify(unit(1, 0, 0)).confidence == 0.9
    assert clf.classify(unit(0.3, 0.3, 1)).confidence == 0.2
    floor = RouteClassifier(config(calibration={"matched": [0.6], "default": [0.2]}, min_confidence=0.7), encode)
    d = floor.classify(unit(1, 0, 0))
    assert (d.route, d.reason, d.confidence) == ("general", "low_confidence", 0.2)


def test_the_encoder_keeps_the_part_requests_truncate_names():
    from esr_model.truncation import cut_ids

    ids = [101] + list(range(1, 11)) + [102]  # [CLS] 1..10 [SEP]
    assert cut_ids(ids, 6, "head") == [101, 1, 2, 3, 4, 102]
    assert cut_ids(ids, 6, "tail") == [101, 7, 8, 9, 10, 102]
    assert cut_ids(ids, 6, "ends") == [101, 1, 2, 9, 10, 102]
    assert cut_ids(ids, 20, "ends") == ids


def test_eval_reports_the_confidence_also_at_the_default_share_fit_calibrates_for():
    from router.classifier import Decision
    from esr_tuning.evaluation import evaluate

    labels = ["math"] * 9 + ["general"]
    decisions = [Decision("math", "m", 1.0, "matched", 0.9)] * 9 + [Decision("math", "m", 1.0, "matched", 0.9)]
    report = evaluate(labels, decisions, ["math", "general"], "general")
    assert report["confidence"]["ece"] == 0.0  # 9 of 10 right at 0.9
    # weighted so the default route's (wrong) example is a fifth: right 0.8 of the time at 0.9
    assert report["confidence"]["shifted"] == {"default_share": 0.2, "ece": 0.1}
