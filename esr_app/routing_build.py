"""Builds what serves one config on one embedder: the routing engine, its filter chain and the
service's settings, reusing what the serving engine already embedded."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from batching import DeadlineExceeded, Embedder, ModelUnavailable, Overloaded, RemoteError
from esr_app.placement import static_tier_on
from esr_config import RouterConfig
from esr_extproc.serving import ServiceSettings, Serving
from esr_model.torch_threads import on_own_thread
from filters.chain import FilterChain
from router.classifier import RouteClassifier
from router.engine import RoutingEngine
from router.static_tier import StaticTier

log = logging.getLogger(__name__)


async def build_serving(config: RouterConfig, embedder: Embedder, current: RoutingEngine | None) -> Serving:
    """The engine for `config` and its filter chain, set up and ready to serve together, on
    `embedder`. `current`: the engine serving now on the same embedder (None: none, or another
    embedder), whose utterance embeddings and cache are reused. Utterances are embedded through
    the batcher: only its model thread touches the model."""
    texts = sorted({u for r in config.routes for u in r.utterances} | set(config.default_route.utterances))
    # What the serving engine already embedded costs nothing again: a reload embeds only new
    # utterances, a few at a time, so live requests are not refused for them.
    known = current.utterances if current is not None else {}
    lookup = {t: known[t] for t in texts if t in known}
    lookup.update(await embed_utterances(embedder, [t for t in texts if t not in lookup],
                                         step=16 if current else max(1, config.batching.max_queue_requests // 2)))

    def encode(batch: Sequence[str]) -> np.ndarray:
        return np.stack([lookup[t] for t in batch])

    # A head trained at load (no head_path) is seconds of torch work: off the event loop, on a
    # thread that then exits, so that only the model thread keeps a torch pool (torch_threads).
    classifier = await on_own_thread(RouteClassifier, config, encode)
    static = await on_own_thread(static_tier, config, current.static.encode if current and current.static else None)
    # One cache across reloads on the same encoder: an embedding does not depend on routes.
    engine = RoutingEngine(config, embedder, classifier, current.cache if current is not None else None,
                           utterances=lookup, static=static, learns=True,
                           feedback=current.feedback if current is not None else None)
    if engine.models.selector is not None and lookup:
        engine.models.selector.quality.require_dimension(next(iter(lookup.values())).shape[-1], config.selection.path)
    return Serving(engine, await FilterChain.for_engine(engine, config.filters, config.filter_settings),
                   service_settings(config, engine))


def static_tier(config: RouterConfig, encode=None) -> StaticTier | None:
    """The cascade's first tier for `config` (None where it is off, or fitted for no route: then
    it would only spend time), serving's and eval's alike; `encode`: a static encoder already
    loaded for the same model (a reload's)."""
    if not static_tier_on(config) or not any(math.isfinite(v) for v in config.static_tier.accept.values()):
        return None
    return StaticTier(config, encode or static_encoder(config))


def static_embedding(config: RouterConfig):
    """The static embedding of `config`'s encoder model (a StaticEncoder), reading the tokens the
    encoder reads, with the rows fit trained for it (static_tier.table_path)."""
    from esr_model.location import resolve_model
    from esr_model.onnx_encoder import model_max_seq_length
    from esr_model.static_embedding import StaticEncoder

    model_dir = Path(resolve_model(config.encoder.model))
    if not model_dir.is_dir():
        raise ValueError(f"static_tier.enabled: {config.encoder.model!r} is not a local model directory "
                         "to distil a static embedding from (set static_tier.enabled: false)")
    limit = model_max_seq_length(model_dir)
    return StaticEncoder(model_dir, min(config.encoder.max_seq_length or limit, limit), config.requests.truncate,
                         trained=config.static_tier.table_path)


def static_encoder(config: RouterConfig):
    """static_embedding(config).encode: what the static tier calls."""
    return static_embedding(config).encode


def service_settings(config: RouterConfig, engine: RoutingEngine) -> ServiceSettings:
    """What the service reads of `config`, served with `engine` (whether it has a static tier sets
    how long a request may wait to be read: ServerConfig.shed_wait_s)."""
    return ServiceSettings(deadline_s=config.server.deadline_ms / 1000.0, requests=config.requests,
                           max_request_headers=config.envoy.max_request_headers,
                           max_inflated_bytes=config.envoy.max_request_bytes, log_prompts=config.log_prompts,
                           server=config.server, cache=config.cache,
                           set_body={**{r.name: r.set_body for r in config.routes if r.set_body},
                                     config.default_route.name: config.default_route.set_body},
                           shed_wait_s=config.server.shed_wait_s(static_tier=engine.static is not None),
                           refuse_undecided=config.refuses_undecided)


# Refusals that say "not now": a start or reload waits them out instead of failing (in a pool, a
# worker whose reload failed would serve the old routes while the others serve the new). A remote
# engine that answered its first call may still time out on a cold batch of utterances on a busy
# node, and a model process may be restarting: both pass.
_NOT_NOW = (Overloaded, DeadlineExceeded, RemoteError, ModelUnavailable)


async def embed_utterances(embedder: Embedder, texts: Sequence[str], step: int,
                           budget_s: float = 300.0) -> dict[str, np.ndarray]:
    """Embeddings of `texts`, `step` at a time; a step the batcher refuses for overload, or its
    engine fails for now, is tried again after a pause (up to `budget_s` in all), so route
    embedding yields to live traffic and waits out an engine's slow start."""
    out: dict[str, np.ndarray] = {}
    give_up = time.monotonic() + budget_s
    for i in range(0, len(texts), step):
        chunk, pause = texts[i:i + step], 0.05
        while True:
            try:
                vectors = await asyncio.gather(*(embedder.embed(t, min(give_up, time.monotonic() + 30.0))
                                                 for t in chunk))
                break
            except _NOT_NOW as exc:
                if time.monotonic() + pause > give_up:
                    raise
                if isinstance(exc, (RemoteError, ModelUnavailable)):
                    log.warning("utterances not embedded yet, trying again", extra={"why": str(exc)})
                await asyncio.sleep(pause)
                pause = min(1.0, pause * 2)
        out.update(zip(chunk, vectors))
    return out
