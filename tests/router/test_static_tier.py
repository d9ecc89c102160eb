"""The cascade's first tier: the static embedding distilled from the bundled model's export, the
tier's decision rule (a fitted margin per route, never the default route), the engine asking the
batcher only for what the tier leaves, the config's checks, and the margins fit picks."""

from __future__ import annotations

import asyncio
import math
import time

import numpy as np
import pytest

from batching import Overloaded
from esr_config import ConfigError
from filters.builtin import SemanticRoute
from filters.chain import FilterChain
from filters.context import RequestContext
from esr_app.routing_build import service_settings, static_encoder, static_tier
from esr_model.location import resolve_model
from esr_model.static_embedding import DIMENSIONS, is_current, static_path
from esr_tuning.evaluation import decide_without_encoder
from esr_tuning.static_fit import MIN_SUPPORT, WholeRequests, _accept_level, fit_margins, with_in_scope_check
from router.classifier import RouteClassifier
from router.engine import RoutingEngine
from router.head import LinearHead
from router.static_tier import StaticTier, margins, static_classifier
from tests.support.fakes import VECTORS, config, encode, unit


@pytest.fixture(scope="module")
def bundled_encode():
    return static_encoder(config(static_tier={"enabled": True}))


def test_the_bundled_model_has_a_current_static_table_that_embeds_text(bundled_encode):
    model_dir = resolve_model("bundled:all-MiniLM-L6-v2")
    assert is_current(model_dir) and static_path(model_dir).is_file()
    v = bundled_encode(["what is 17 times 23", "write a python function that sorts a list", ""])
    assert v.shape == (3, DIMENSIONS)
    assert np.allclose(np.linalg.norm(v[:2], axis=1), 1.0, atol=1e-5)
    assert not v[2].any()  # no tokens: no vector, and no error
    same = bundled_encode(["what is 17 times 23"])  # a text alone (the loop's path) as in a batch, bit for bit
    assert same.shape == (1, DIMENSIONS) and np.array_equal(same[0], v[0])
    assert bundled_encode([""]).shape == (1, DIMENSIONS) and not bundled_encode([""]).any()
    # Related prompts sit closer than unrelated ones.
    near = bundled_encode(["what is 18 times 24"])[0]
    assert float(near @ v[0]) > float(v[1] @ v[0]) + 0.2


def test_a_long_text_is_cut_to_the_encoder_window_keeping_the_part_asked_for():
    head = static_encoder(config(static_tier={"enabled": True}, requests={"truncate": "head"}))
    tail = static_encoder(config(static_tier={"enabled": True}, requests={"truncate": "tail"}))
    start, end = "solve the quadratic equation x^2 - 5x + 6 = 0 " * 30, "write a bash script that renames files " * 30
    text = start + end
    assert float(head([text])[0] @ head([start])[0]) > 0.99
    assert float(tail([text])[0] @ tail([end])[0]) > 0.99


def tier_of(**static) -> StaticTier:
    return StaticTier(config(static_tier={"enabled": True, **static}), encode)


def test_the_tier_decides_a_route_it_leads_by_its_margin_and_nothing_else():
    tier = tier_of(accept={"math": 0.5, "code": 0.5})
    decided = tier.decide(["m1"])  # math 1.0 against code ~0.2
    assert decided is not None and (decided.route, decided.tier, decided.reason) == ("math", "static", "matched")
    assert tier.decide(["m3"]) is None  # m3 is math's, though hardly further from code's c1: the encoder decides
    assert tier.decide(["g1"]) is None  # the default route: always the encoder's
    assert tier_of(accept={"code": 0.5}).decide(["m1"]) is None  # a route with no fitted margin: never


def head_config(tmp_path, **static):
    """A static head that tells math (x) from code (y) by the axis that leads, its prototypes the
    two axes: g1 (z) lies near neither."""
    weight = np.asarray([[10, 0, 0], [0, 10, 0]], dtype=np.float32)
    head = LinearHead(("math", "code"), ("math", "code"), weight, np.zeros(2, dtype=np.float32)
                      ).with_prototypes(np.stack([unit(1, 0, 0), unit(1, 0.1, 0), unit(0, 1, 0)]), ["math", "math", "code"])
    head.save(tmp_path / "static.npz")
    return config(classifier={"method": "head", "head_score": "energy"}, default_threshold=1.0,
                  static_tier={"enabled": True, "head_path": str(tmp_path / "static.npz"),
                               "accept": {"math": 2.0, "code": 2.0}, **static})


def head_tier(tmp_path, **static) -> StaticTier:
    """head_config's tier; a text is a fixture name or its vector's coordinates ("0.4 0 0.9")."""
    return StaticTier(head_config(tmp_path, **static), lambda texts: np.stack(
        [VECTORS[t] if t in VECTORS else unit(*map(float, t.split())) for t in texts]))


def test_the_in_scope_check_leaves_to_the_encoder_a_prompt_far_from_all_the_head_was_taught(tmp_path):
    # "0.4 0 0.9" leads code by 4 logits, far past math's margin, yet lies nearer g1 than any prototype.
    assert head_tier(tmp_path).decide(["0.4 0 0.9"]).route == "math"
    tier = head_tier(tmp_path, min_similarity=0.6)
    assert tier.decide(["0.4 0 0.9"]) is None
    assert tier.decide(["m2"]).route == "math"  # near math's prototype: decided as before
    assert LinearHead.load(tmp_path / "static.npz").prototypes.shape == (2, 3)


def test_fit_sets_the_in_scope_check_where_most_held_out_in_scope_decisions_stand(tmp_path):
    tier = head_tier(tmp_path)
    rng = np.random.default_rng(0)
    # In scope: near the math and code axes, a few further out; out of scope: leaning math from z.
    inside = np.stack([unit(1, 0, s) for s in rng.uniform(0, 0.8, 100)] + [unit(0, 1, s) for s in rng.uniform(0, 0.8, 100)])
    outside = np.stack([unit(0.5, 0, 1) for _ in range(10)])
    vectors, truth = np.concatenate([inside, outside]), np.asarray([0] * 100 + [1] * 100 + [-1] * 10)
    fitted, notes = with_in_scope_check(head_config(tmp_path), tier.classifier, vectors, truth)
    prototypes = LinearHead.load(tmp_path / "static.npz").prototypes
    cut = fitted.static_tier.min_similarity
    near = (inside @ prototypes.T).max(axis=1)
    assert 0.96 <= (near >= cut).mean() <= 0.99  # IN_SCOPE_KEEP of the in-scope decisions stand
    assert float(unit(0.5, 0, 1) @ prototypes[0]) < cut
    assert "keeps 98.0%" in notes[0] and "0 of 10 out-of-scope (were 10)" in notes[0]
    few = with_in_scope_check(head_config(tmp_path), tier.classifier, vectors[:MIN_SUPPORT - 1], truth[:MIN_SUPPORT - 1])
    assert few[0].static_tier.min_similarity is None and few[1] == []  # too few decisions to say anything


def test_an_in_scope_check_needs_prototypes_saved_with_the_head(tmp_path):
    head = LinearHead(("math", "code"), ("math", "code"), np.eye(2, 3, dtype=np.float32), np.zeros(2, dtype=np.float32))
    head.save(tmp_path / "bare.npz")
    assert LinearHead.load(tmp_path / "bare.npz").prototypes is None
    cfg = config(classifier={"method": "head"}, static_tier={
        "enabled": True, "head_path": str(tmp_path / "bare.npz"), "accept": {"math": 1.0}, "min_similarity": 0.5})
    with pytest.raises(ValueError, match="static_tier.min_similarity: the static head has no class prototypes"):
        StaticTier(cfg, encode)


def test_in_a_conversation_the_tier_decides_only_on_the_requests_own_turn():
    tier = tier_of(accept={"math": 0.5, "code": 0.5})
    decided = tier.decide(["c1", "m1"])  # the request's own turn names math: decided here
    assert decided is not None and (decided.route, decided.reason) == ("math", "matched")
    # The follow-up names nothing and the earlier math turn would carry the route: that is the encoder's call.
    assert tier.decide(["m1", "g1"]) is None


def test_margins_lead_over_the_runner_up_and_below_thresholds_for_the_default_route():
    classifier = RouteClassifier(config(), encode)
    scores = np.asarray([[0.9, 0.3], [0.5, 0.45], [0.2, 0.1]], dtype=np.float32)
    choices = classifier.choose(scores)
    assert list(choices) == [0, -1, -1]  # default_threshold 0.8
    assert np.allclose(margins(classifier, scores, choices), [0.6, 0.3, 0.6])


class Recording:
    """The batcher's part, recorded: which texts the engine asked it to embed."""

    def __init__(self):
        self.asked: list[str] = []

    async def embed(self, text, deadline, bulk=False):
        self.asked.append(text)
        return encode([text])[0]


def test_the_engine_asks_the_batcher_only_for_what_the_tier_leaves():
    cfg = config(static_tier={"enabled": True, "accept": {"math": 0.5, "code": 0.5}})
    batcher = Recording()
    engine = RoutingEngine(cfg, batcher, RouteClassifier(cfg, encode), static=StaticTier(cfg, encode))

    async def run():
        return [await engine.decide([t], deadline=float("inf")) for t in ("m1", "m2", "m3")]

    decisions = asyncio.run(run())  # m3 is math's, though hardly further from code's c1
    assert [(d.route, d.tier) for d in decisions] == [("math", "static"), ("math", "static"), ("math", "encoder")]
    assert batcher.asked == ["m3"]


def test_a_router_with_a_static_tier_reads_a_late_request_that_one_without_sheds():
    # Past the deadline only the tier can still route a request: without one, a request read late
    # would cost a parse only to fall back where a shed one goes (c512, encoder only: goodput
    # 216-225 req/s shedding at 350 ms, 101-164 at 600 ms).
    cfg = config(static_tier={"enabled": True, "accept": {"math": 0.5, "code": 0.5}})
    tiered = RoutingEngine(cfg, Recording(), RouteClassifier(cfg, encode), static=StaticTier(cfg, encode))
    alone = RoutingEngine(cfg, Recording(), RouteClassifier(cfg, encode))
    assert service_settings(cfg, tiered).shed_wait_s == pytest.approx(0.55 * cfg.server.message_timeout_ms / 1000)
    assert service_settings(cfg, alone).shed_wait_s == pytest.approx(0.7 * cfg.server.deadline_ms / 1000)
    for ms in (250.0, 0.0):  # set: the same whoever serves
        set_wait = config(static_tier={"enabled": True, "accept": {"math": 0.5}}, server={"shed_wait_ms": ms})
        assert service_settings(set_wait, tiered).shed_wait_s == service_settings(set_wait, alone).shed_wait_s == ms / 1000


class Refusing:
    """The batcher's part, overloaded: it refuses every text, as the queue does when it would be late."""

    async def embed(self, text, deadline, bulk=False):
        raise Overloaded("predicted to answer after the deadline")


@pytest.mark.parametrize("fallback, routes", [("guess", ["math", "general"]), ("default", ["general", "general"])])
def test_where_the_encoder_cannot_answer_the_tier_s_guess_routes_under_the_fallback_s_reason(fallback, routes):
    cfg = config(static_tier={"enabled": True, "accept": {"math": 0.5, "code": 0.5}, "fallback": fallback})
    engine = RoutingEngine(cfg, Refusing(), RouteClassifier(cfg, encode), static=StaticTier(cfg, encode))

    async def run():  # m3: math's, below its margin; g1: the default route's, never guessed
        return [await engine.decide([t], deadline=float("inf")) for t in ("m3", "g1")]

    decisions = asyncio.run(run())
    assert [d.route for d in decisions] == routes
    assert [d.reason for d in decisions] == ["fallback_overload", "fallback_overload"]
    assert decisions[0].tier == ("static" if fallback == "guess" else "")


def test_a_request_late_before_the_encoder_is_asked_is_refused_at_once_and_routed_by_the_guess():
    cfg = config(static_tier={"enabled": True, "accept": {"math": 0.5, "code": 0.5}})
    batcher = Recording()
    engine = RoutingEngine(cfg, batcher, RouteClassifier(cfg, encode), static=StaticTier(cfg, encode))

    async def run():  # it waited in front of the router past its deadline
        return [await engine.decide([t], deadline=time.monotonic() - 0.01) for t in ("m1", "m3")]

    sure, leaning = asyncio.run(run())
    assert (sure.route, sure.reason, sure.tier) == ("math", "matched", "static")  # the tier needs no time
    assert (leaning.route, leaning.reason, leaning.tier) == ("math", "fallback_overload", "static")
    assert batcher.asked == []  # the model never saw it


class Stalled:
    """The batcher's part, stalled: nothing it is given comes back."""

    async def embed(self, text, deadline, bulk=False):
        await asyncio.sleep(3600)


def test_when_the_chain_runs_out_of_time_on_the_encoder_the_guess_routes_the_request():
    cfg = config(static_tier={"enabled": True, "accept": {"math": 0.5, "code": 0.5}})
    engine = RoutingEngine(cfg, Stalled(), RouteClassifier(cfg, encode), static=StaticTier(cfg, encode))

    async def run(text):
        ctx = RequestContext(path="/v1/chat/completions", headers={}, body={}, requested_model=None,
                             deadline=time.monotonic() + 0.05, engine=engine, turns=(text,))
        why = await FilterChain([SemanticRoute()]).run(ctx)
        return why, ctx.decision

    why, decision = asyncio.run(run("m3"))
    assert why == "fallback_timeout"
    assert (decision.route, decision.reason, decision.tier) == ("math", "fallback_timeout", "static")
    assert asyncio.run(run("g1"))[1] is None  # no guess for the default route's: the service's default takes it


def test_eval_decides_as_the_server_does_with_the_encoder_taken_away():
    cfg = config(static_tier={"enabled": True, "accept": {"math": 0.5, "code": 0.5}})
    decided = decide_without_encoder(cfg, RouteClassifier(cfg, encode), ["m1", "m3", "g1"], StaticTier(cfg, encode))
    assert [(d.route, d.reason, d.tier) for d in decided] == [
        ("math", "matched", "static"), ("math", "fallback_unavailable", "static"), ("general", "fallback_unavailable", "")]


def test_no_tier_is_built_where_it_is_off_or_fitted_for_no_route():
    assert static_tier(config(static_tier={"enabled": False, "accept": {"math": 0.1}})) is None
    assert static_tier(config(static_tier={"enabled": True})) is None
    assert static_tier(config(static_tier={"enabled": True, "accept": {"math": math.inf}})) is None
    assert static_tier(config(static_tier={"enabled": True, "accept": {"math": 0.1}})) is not None


@pytest.mark.parametrize("section, key", [
    ({"accept": {"general": 0.1}}, "static_tier.accept.general"),
    ({"accept": {"poetry": 0.1}}, "static_tier.accept.poetry"),
    ({"accept": {"math": -0.1}}, "static_tier.accept.math"),
    ({"thresholds": {"math": float("inf")}}, "static_tier.thresholds.math"),
    ({"enabled": "sometimes"}, "static_tier.enabled"),
    ({"min_similarity": 1.5}, "static_tier.min_similarity"),
    ({"fallback": "encoder"}, "static_tier.fallback"),
])
def test_a_bad_static_tier_section_names_its_key(section, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        config(static_tier=section)


def test_fit_keeps_the_lowest_margin_whose_decisions_agree_with_the_encoder():
    rng = np.random.default_rng(0)
    lead = rng.uniform(0, 1, 1000)
    agrees = (lead > 0.3) | (rng.uniform(0, 1, 1000) < 0.5)  # below 0.3, half disagree
    cost = (~agrees).astype(np.int64)
    level = _accept_level(lead, cost, 0.004)
    assert 0.29 < level < 0.4
    kept = lead >= level
    assert (~agrees[kept]).sum() <= 0.004 * kept.sum()
    assert _accept_level(lead[:10], cost[:10], 0.004) == math.inf  # too few to say anything
    assert _accept_level(lead, np.ones(1000, dtype=np.int64), 0.004) == math.inf
    # Judged on accuracy: a wrong static decision the encoder also gets wrong costs nothing.
    assert _accept_level(lead, np.where(agrees, 0, np.where(lead > 0.1, 0, 1)), 0.004) < level


def test_margins_also_hold_on_whole_requests_the_encoder_routed_by_their_context():
    """A follow-up whose newest turn reads like math, recorded as routed to code by its context: set
    on single turns alone, math's margin would let the tier decide it math; with the whole requests
    among its examples, math stays the encoder's and code's margin is untouched."""
    cfg = config(static_tier={"enabled": True})
    classifier = static_classifier(cfg, encode)
    single = ["m1"] * 30 + ["c1"] * 30
    scores, agree = classifier.scores(encode(single)), np.asarray([0] * 30 + [1] * 30)
    alone, _ = fit_margins(cfg, classifier, scores, agree)
    assert math.isfinite(alone.static_tier.accept["math"]) and math.isfinite(alone.static_tier.accept["code"])
    followups = WholeRequests([("c1", "m1")] * 10, ["code"] * 10)
    choices, lead, theirs = followups.examples(alone, encode, None)
    assert list(choices) == [0] * 10 and list(theirs) == [1] * 10 and (lead > 0.5).all()  # decided as serving would
    whole, _ = fit_margins(cfg, classifier, scores, agree, more=lambda tuned: followups.examples(tuned, encode, None))
    assert whole.static_tier.accept["math"] == math.inf
    assert whole.static_tier.accept["code"] == alone.static_tier.accept["code"]
    # Weighed by a teacher (a head config's refit), the follow-ups count as the encoder's sure choice.
    taught = np.eye(2, dtype=np.float32)[agree]
    weighed, _ = fit_margins(cfg, classifier, scores, agree, teacher=taught,
                             more=lambda tuned: followups.examples(tuned, encode, None))
    assert weighed.static_tier.accept["math"] == math.inf
    assert StaticTier(alone, encode).decide(["c1", "m1"]).route == "math"  # what single turns let through
    assert StaticTier(whole, encode).decide(["c1", "m1"]) is None


def test_auto_is_on_for_a_local_encoder_on_cpu_or_cuda_where_the_table_can_be_made_or_behind_a_pool_where_it_is(tmp_path):
    from esr_app.placement import static_tier_on

    # the bundled model on CUDA (torch): its table is there; measured faster there too (docs/static-tier.md, "On a GPU")
    assert static_tier_on(config(encoder={"device": "cuda", "backend": "torch"}))
    assert static_tier_on(config(encoder={"device": "cpu", "backend": "onnx"}))
    # a model directory with neither a table nor an ONNX export: off, rather than failing to start
    bare = tmp_path / "model"
    bare.mkdir()
    assert not static_tier_on(config(encoder={"model": str(bare), "device": "cuda", "backend": "torch"}))
    assert not static_tier_on(config(encoder={"model": "org/some-model", "device": "cuda", "backend": "torch"}))
    # Behind a model process (a pool's workers): on where the table is already made, none distils one
    assert static_tier_on(config(encoder={"socket": "/tmp/model.sock"}))
    (bare / "onnx").mkdir()
    (bare / "onnx" / "model.onnx").write_bytes(b"")  # an export to distil from, but no table made
    assert static_tier_on(config(encoder={"model": str(bare), "device": "cpu", "backend": "onnx"}))
    assert not static_tier_on(config(encoder={"model": str(bare), "socket": "/tmp/model.sock"}))
    assert static_tier_on(config(encoder={"model": str(bare), "socket": "/tmp/model.sock"}, static_tier={"enabled": True}))
    # A remote engine's weights need not be the local copy's
    assert not static_tier_on(config(encoder={"remote": {"url": "https://engine.example:7997", "model": "m"}}))
