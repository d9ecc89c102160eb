"""Selection feedback through a real Envoy: the answer carries a signed selection id, an evaluator
posts its score to the gateway with the feedback token, and scores under the prediction move the
route's traffic to the next model. A client without the token, a forged id and a second score for
one request are refused, each with its status and counted."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import httpx
import numpy as np
import pytest

from devstack.stack import stack_with
from esr_app.routing_build import static_tier
from esr_config import load_config
from esr_app.quality_cli import offline
from router.selection import QualityModel, load_quality, save_quality
from tests.support import ROOT
from tests.support.stack import DUPLEX
from tests.support.waiting import wait_for

TOKEN = "feedback-token-for-the-integration-test"
PROMPT = "solve the equation 2x + 3 = 7 for x"


@pytest.fixture(scope="module")
def stack(tmp_path_factory, envoy_binary):
    workdir = tmp_path_factory.mktemp("feedback")
    # Predictions that ignore the prompt: general-model 0.85, math-model 0.95 (bias only), from the
    # encoder's vectors and from the static tier's alike (whichever tier decides, selection chooses).
    static_dimension = static_tier(load_config(ROOT / "router.yaml")).encode(["x"]).shape[-1]

    def bias_only(dimension: int) -> QualityModel:
        weights = np.zeros((2, dimension + 1), dtype=np.float32)
        weights[:, -1] = (0.85, 0.95)
        return QualityModel(("general-model", "math-model"), weights, np.array([0.02, 0.02], np.float32), 0.1)

    quality = dataclasses.replace(bias_only(384), static=bias_only(static_dimension))
    save_quality(quality, str(workdir / "quality.npz"), "bundled:all-MiniLM-L6-v2")

    def selecting(config: dict) -> None:
        math = next(r for r in config["routes"] if r["name"] == "math")
        math["models"] = ["math-model", "general-model"]
        config["records"] = {"enabled": True, "prompts": True, "path": str(workdir / "records.jsonl")}
        config["selection"] = {"path": str(workdir / "quality.npz"), "quality_floor": 0.8,
                               "prices": {"general-model": 1, "math-model": 10},
                               "feedback": {"enabled": True, "explore": 0.0, "prior": 2, "half_life": 10}}

    with stack_with(workdir, selecting, router_env={"SEMANTIC_ROUTER_FEEDBACK_TOKEN": TOKEN}) as s:
        yield s


def _chat(stack) -> httpx.Response:
    r = httpx.post(f"{stack.url}/v1/chat/completions", timeout=30,
                   json={"model": "auto", "messages": [{"role": "user", "content": PROMPT}]})
    assert r.status_code == 200, r.text
    assert r.headers["x-semantic-route"] == "math"
    return r


def test_a_static_tier_decision_is_selected_too(stack):
    r = _chat(stack)
    assert r.headers["x-semantic-route-tier"] == "static"  # this prompt is decided without the encoder
    assert r.headers["x-semantic-selection-id"]


def test_selection_first_fails_over_to_the_next_model_and_the_score_counts_for_the_model_that_answered(stack):
    """Selection puts the cheap model first, against the route's ranked list: Envoy still fails over
    along that order, and the answer's id names the model that answered."""
    r = httpx.post(f"{stack.url}/v1/chat/completions", timeout=30, headers={"x-mock-fail": "general-model=503"},
                   json={"model": "auto", "messages": [{"role": "user", "content": PROMPT}]})
    assert r.status_code == 200, r.text
    assert r.headers["x-selected-model"] == "general-model"
    assert r.headers["x-semantic-route-served-model"] == "math-model"
    assert r.headers["x-semantic-selection-id"].endswith("~math-model")
    accepted = _score(stack, r.headers["x-semantic-selection-id"], 0.95)
    assert accepted.status_code == 200, accepted.text
    assert (accepted.json()["model"], accepted.json()["selected"]) == ("math-model", "general-model")
    plain = _chat(stack)  # no failover: the id names the selected model, which answered
    assert plain.headers["x-semantic-route-served-model"] == "general-model"
    assert plain.headers["x-semantic-selection-id"].endswith("~general-model")


def _score(stack, selection_id: str, score: float, token: str | None = TOKEN) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{stack.url}/semantic-router/feedback", json={"selection_id": selection_id, "score": score},
                      headers=headers, timeout=30)


def _counted(stack, outcome: str) -> float:
    text = httpx.get(stack.metrics_url, timeout=10).text
    line = f'semantic_router_selection_feedback_total{{outcome="{outcome}"}}'
    return next((float(x.split()[-1]) for x in text.splitlines() if x.startswith(line)), 0.0)


def test_scores_under_the_prediction_move_the_route_to_its_next_model(stack):
    first = _chat(stack)
    assert first.headers["x-selected-model"] == "general-model"  # the cheap one meets the floor
    selection_id = first.headers["x-semantic-selection-id"]
    accepted = _score(stack, selection_id, 0.3)
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["model"] == "general-model" and accepted.json()["correction"] < 0
    for _ in range(10):  # its answers keep scoring 0.3 where 0.85 was predicted
        r = _chat(stack)
        if r.headers["x-selected-model"] != "general-model":
            break
        assert _score(stack, r.headers["x-semantic-selection-id"], 0.3).status_code == 200
    assert _chat(stack).headers["x-selected-model"] == "math-model"
    assert _counted(stack, "accepted") >= 1


def test_feedback_without_the_token_a_forged_id_or_a_second_score_is_refused(stack):
    selection_id = _chat(stack).headers["x-semantic-selection-id"]
    before = {k: _counted(stack, k) for k in ("unauthorized", "bad_id", "repeated", "bad_body")}
    assert _score(stack, selection_id, 1.0, token=None).status_code == 401
    empty = httpx.post(f"{stack.url}/semantic-router/feedback", headers={"authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert empty.status_code == 400 and empty.json()["error"]["code"] == "feedback_bad_body"
    large = httpx.post(f"{stack.url}/semantic-router/feedback", content=b" " * 5000, timeout=30,
                       headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"})
    assert large.status_code == 413
    assert _score(stack, selection_id, 1.0, token="not-the-token-at-all-no").status_code == 401
    body, _, mac = selection_id.rpartition(".")
    parts = body.split(".")
    forged = ".".join([*parts[:2], "10000", *parts[3:]]) + "." + mac
    assert _score(stack, forged, 1.0).status_code == 400
    assert _score(stack, selection_id, 2.0).status_code == 400  # a score is in [0, 1]
    assert _score(stack, selection_id, 1.0).status_code == 200
    again = _score(stack, selection_id, 1.0)
    assert again.status_code == 409 and again.json()["error"]["code"] == "feedback_repeated"
    after = {k: _counted(stack, k) for k in before}
    assert after == {"unauthorized": before["unauthorized"] + 2, "bad_id": before["bad_id"] + 1,
                     "repeated": before["repeated"] + 1, "bad_body": before["bad_body"] + 2}


def test_a_client_cannot_send_its_own_selection_id_upstream(stack):
    r = httpx.post(f"{stack.url}/v1/chat/completions", timeout=30,
                   headers={"x-semantic-selection-id": "made.up.id"},
                   json={"model": "auto", "messages": [{"role": "user", "content": PROMPT}]})
    assert r.status_code == 200 and r.headers["x-semantic-selection-id"] != "made.up.id"


def test_the_recorded_scores_refit_selection_beside_the_eval_rows(stack, tmp_path):
    """The loop after deploy: the router records each score it took beside its request's record;
    select-fit --records learns from them with the team's eval rows. The earlier tests' scores of 0.3
    for general-model's answers on this route lower its predicted score there."""
    records = stack.router_config.parent / "records.jsonl"

    def scores_recorded() -> int:
        lines = [json.loads(x) for x in records.read_text().splitlines() if x.strip()] if records.exists() else []
        return sum(x.get("kind") == "score" for x in lines)

    wait_for(lambda: scores_recorded() >= 3, 10, "the scores taken, recorded")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"what is {i} plus {i + 3}", "model": m, "score": s}) + "\n"
                            for i in range(60) for m, s in (("general-model", 0.85), ("math-model", 0.95))))

    def fitted(*more: str) -> float:
        out = tmp_path / f"fitted{len(more)}.yaml"
        done = subprocess.run([sys.executable, "-m", "esr_app", "select-fit", "--config", str(stack.router_config),
                               "--rows", str(rows), *more, "--out", str(out)], cwd=ROOT, capture_output=True,
                              text=True, timeout=300, env={**os.environ, "SEMANTIC_ROUTER_FEEDBACK_TOKEN": TOKEN})
        assert done.returncode == 0, done.stderr
        if more:
            assert "scores from records ({'joined': " in done.stdout, done.stdout
        quality = load_quality(str(out.with_suffix(".quality.npz")))
        vector = offline(load_config(stack.router_config))[0].encode([PROMPT])[0]
        return float(quality.weights[0, :-1] @ vector + quality.weights[0, -1])  # general-model's

    assert fitted("--records", str(records)) < fitted() - 0.05


def test_with_the_router_down_a_score_reaches_no_backend_and_is_asked_again(stack):
    """Last in this module: it kills the router. A score the router cannot answer is Envoy's: a 503
    to post it again (buffered and streamed bodies, where Envoy goes on without the router), or
    Envoy's own error (full duplex, where it does not); never a backend's answer."""
    selection_id = _chat(stack).headers["x-semantic-selection-id"]
    stack.kill_router()
    r = _score(stack, selection_id, 0.5)
    assert "x-mock-backend" not in r.headers, r.headers
    if DUPLEX:
        assert r.status_code >= 500
    else:
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "feedback_not_taken"
