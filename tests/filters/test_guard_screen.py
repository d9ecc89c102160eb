"""The prompt guard's static screen: a request it clears never reaches the encoder, one it does not
is scored as before, its bar sits under every held-out attack the guard catches, and it serves only
over the static table it was fitted on."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from batching import BatcherSettings, ContinuousBatcher
from esr_app.routing_build import static_embedding
from esr_config import ConfigError
from esr_tuning.guard import SCREEN_MARGIN, GuardRequest, fit_guard, request_scores, screened, split_groups
from filters import metrics
from filters.builtin import PromptGuard, screen_embedding
from filters.context import RequestContext
from router.classifier import RouteClassifier
from router.engine import RoutingEngine
from router.guard import SCREEN_MAX_CHARS, SCREEN_MAX_PIECES, GuardHead, GuardScorer, StaticScreen
from tests.support.fakes import FakeBackend, config, encode
from tests.support.guard_texts import ATTACKS, BENIGN


def requests() -> list[GuardRequest]:
    rows = [(t, True) for t in ATTACKS] + [(t, False) for t in BENIGN]
    return [GuardRequest((t,), blocked, "attack" if blocked else "benign", i, t) for i, (t, blocked) in enumerate(rows)]


@pytest.fixture(scope="module")
def static():
    return static_embedding(config(static_tier={"enabled": True}))


@pytest.fixture(scope="module")
def fitted(static):
    reqs = requests()
    vectors = dict(zip([r.text for r in reqs], static.encode([r.text for r in reqs])))  # the guard's own vectors
    return reqs, fit_guard(reqs, vectors, None, True, 0.01, holdout=0.5, static=static)


def test_fit_sets_the_bar_under_every_held_out_attack_the_guard_catches(fitted, static):
    reqs, fit = fitted
    screen = fit.screen
    assert screen is not None and screen.table == static.digest and screen.dimension == static.dimension
    _, held = split_groups(reqs, 0.5, 0)
    held_reqs = [reqs[i] for i in held]
    vectors = dict(zip([r.text for r in reqs], static.encode([r.text for r in reqs])))
    caught = np.asarray([r.blocked for r in held_reqs]) & \
        (request_scores(GuardScorer(head=fit.head), held_reqs, vectors) >= fit.threshold)
    assert caught.any()
    static_scores = request_scores(GuardScorer(head=GuardHead(screen.weights, screen.bias)), held_reqs, vectors)
    assert screen.below == pytest.approx(SCREEN_MARGIN * static_scores[caught].min())
    cleared = screened(screen, static.encode, held_reqs)
    assert not (cleared & caught).any()  # no caught attack is let on by the screen
    assert cleared[~np.asarray([r.blocked for r in held_reqs])].any()  # and it clears benign traffic
    assert any("static screen: clears" in note for note in fit.notes)


def served(static):
    """What a static tier offers the screen: its embedding and that embedding's encode."""
    return SimpleNamespace(embedding=static, encode=static.encode)


def guard_with(screen: StaticScreen, static, backend: FakeBackend):
    settings = {"head": {"weights": [0.0] * FakeBackend.dim, "bias": -8.0}, "threshold": 0.5,
                "static_screen": {"weights": list(screen.weights), "bias": screen.bias, "below": screen.below,
                                  "table": screen.table}}
    batcher = ContinuousBatcher(backend, BatcherSettings())
    batcher.start()
    cfg = config()
    engine = RoutingEngine(cfg, batcher, RouteClassifier(cfg, encode), static=served(static))
    return PromptGuard(settings), engine, batcher


def ctx_for(engine, text):
    return RequestContext(path="/v1/chat/completions", headers={}, body={}, requested_model=None,
                          deadline=time.monotonic() + 10, engine=engine, guard_pieces=(text,))


def test_what_the_screen_clears_never_reaches_the_encoder(fitted, static):
    _, fit = fitted
    backend = FakeBackend()

    async def main():
        guard, engine, batcher = guard_with(fit.screen, static, backend)
        await guard.setup(engine)
        benign = next(t for t in BENIGN if fit.screen.clears(static.encode, (t,)))
        before = metrics.GUARD_SCREENED._value.get()
        await guard(ctx_for(engine, benign))
        assert metrics.GUARD_SCREENED._value.get() == before + 1
        await guard(ctx_for(engine, ATTACKS[0]))  # not cleared: the encoder scores it, as without a screen
        long = benign + " and" * (SCREEN_MAX_CHARS // 4)  # past what the screen embeds on the loop
        assert not fit.screen.clears(static.encode, (long,))
        assert not fit.screen.clears(static.encode, (benign,) * (SCREEN_MAX_PIECES + 1))
        assert fit.screen.clears(static.encode, (benign,) * SCREEN_MAX_PIECES)
        await guard(ctx_for(engine, long))
        await batcher.aclose()
        return benign, long

    benign, long = asyncio.run(main())
    embedded = {t for batch in backend.batches for t in batch}
    assert benign not in embedded and ATTACKS[0] in embedded and long in embedded


def test_a_screen_fitted_on_another_table_is_off(fitted, static, caplog):
    _, fit = fitted
    other = StaticScreen(fit.screen.weights, fit.screen.bias, 0.99, "0" * 24)  # would clear almost anything
    caplog.set_level(logging.WARNING)
    assert screen_embedding(other, served(static)) is None
    assert "fitted on another static table" in caplog.text
    assert screen_embedding(fit.screen, None) is None  # no static tier serves
    assert screen_embedding(fit.screen, served(static)) == static.encode


def test_a_screen_stays_on_over_the_same_table_distilled_on_another_cpu(fitted, static, tmp_path):
    """Another CPU class's kernels make the distilled table anew with other last bits: the screen
    fitted over this machine's table serves there, and clears what it clears here."""
    from esr_model.location import EXPORT_DIR, resolve_model
    from esr_model.static_embedding import STATIC_FILE, StaticEncoder

    reqs, fit = fitted
    model_dir = Path(resolve_model(config(static_tier={"enabled": True}).encoder.model))
    there = tmp_path / "model"
    shutil.copytree(model_dir, there, copy_function=os.symlink, ignore=shutil.ignore_patterns(EXPORT_DIR))
    (there / EXPORT_DIR).mkdir()
    for name in ("model.onnx", "source.json"):
        os.symlink(model_dir / EXPORT_DIR / name, there / EXPORT_DIR / name)
    noise = 1 + 1e-6 * np.random.default_rng(0).standard_normal(static.table.shape)
    np.savez(there / EXPORT_DIR / STATIC_FILE, table=(static.table * noise).astype(np.float32),
             source=np.asarray(static.source))
    other = StaticEncoder(there, static.max_tokens, static.keep)
    assert not np.array_equal(other.table, static.table) and other.digest == static.digest
    assert screen_embedding(fit.screen, served(other)) == other.encode
    assert list(screened(fit.screen, other.encode, reqs)) == list(screened(fit.screen, static.encode, reqs))
    rows = np.asarray(static.token_ids("salary"), dtype=np.int64)
    retrained = other.with_rows(rows, np.ones((len(rows), static.dimension), dtype=np.float32))
    assert retrained.digest != static.digest  # rows trained over it make it another table


@pytest.mark.parametrize("field, value, key", [("below", 0.0, "below"), ("below", 1.5, "below"),
                                               ("table", "", "table"), ("weights", [float("nan")], "weights")])
def test_a_bad_screen_names_its_key(field, value, key):
    screen = {"weights": [0.1, 0.2], "bias": 0.0, "below": 0.1, "table": "abc", field: value}
    with pytest.raises(ConfigError, match=f"static_screen.{key}"):
        PromptGuard({"head": {"weights": [0.1, 0.2], "bias": 0.0}, "static_screen": screen})
