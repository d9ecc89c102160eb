"""What embeds for a config: the backend (a model loaded here, or a remote engine) and the continuous
batcher that drives it, built the same way by the router and the model process."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from batching import Backend, BatcherSettings, ContinuousBatcher
from batching.batcher import BatchHook
from batching.settings import GPU_BATCH
from esr_app.placement import on_gpu, runtime, static_tier_on
from esr_config import RouterConfig
from esr_app.metrics import PrometheusBatchObserver

class Encoder(Backend[Any], Protocol):
    """A backend that also embeds texts directly, outside a batcher (offline: eval, fit, classify)."""

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


BackendFactory = Callable[[RouterConfig], Backend]


def make_backend(config: RouterConfig, offline: bool = False) -> Encoder:
    """`offline`: for a command (fit, eval) that has the machine's CPUs to itself."""
    if config.encoder.remote is not None:
        from esr_remote.backend import RemoteBackend

        return RemoteBackend(config.encoder.remote)
    # The static tier decides most requests on the event loop, beside the model: it keeps a CPU.
    front_end_cpus = 1 if static_tier_on(config) and not offline else 0
    if runtime(config) == "onnx":
        from esr_model.onnx_encoder import OnnxEncoder

        return OnnxEncoder(config.encoder, keep=config.requests.truncate, front_end_cpus=front_end_cpus)
    from esr_model.encoder import SentenceEncoder

    return SentenceEncoder(config.encoder, keep=config.requests.truncate, front_end_cpus=front_end_cpus)


def front_end_tokens(config: RouterConfig) -> Callable[[dict | None], Callable[[str], bytes | None] | None] | None:
    """What a front end of the model process tokenizes with, so that the model process need not
    (esr_model/token_ids.py): the encoder's tokenizer, where encoder.model is a local model directory;
    None where it is not (the front end sends text)."""
    from pathlib import Path

    from esr_model.location import resolve_model
    from esr_model.token_ids import FrontEndTokens

    spec = config.encoder.model
    if not spec.startswith("bundled:") and not Path(spec).is_dir():
        return None  # a hub name: nothing here to tokenize with
    try:
        model_dir = Path(resolve_model(spec))
    except ValueError:
        return None
    if not (model_dir / "tokenizer.json").is_file():
        return None
    return FrontEndTokens(model_dir).maker


def batcher_shape(config: RouterConfig) -> tuple[BatcherSettings, int]:
    """The batcher's settings and lanes (batches in flight). A remote engine takes `max_batch`
    inputs a call and `max_in_flight` calls at once, and pads its own batches: ours need not
    be cut by padding; nor need a GPU's (`batching.max_padding: auto`), which also takes larger
    batches (`batching.max_batch_size: auto`)."""
    remote = config.encoder.remote
    if remote is None:
        batching = config.batching
        if "auto" in (batching.max_padding, batching.max_batch_size) and on_gpu(config):
            padding = 1.0 if batching.max_padding == "auto" else batching.max_padding
            size = min(GPU_BATCH, batching.max_queue_requests) if batching.max_batch_size == "auto" \
                else batching.max_batch_size
            return dataclasses.replace(batching, max_padding=padding, max_batch_size=size), 1
        return batching, 1
    settings = dataclasses.replace(
        config.batching, max_batch_size=remote.max_batch, max_padding=1.0,
        max_queue_requests=max(config.batching.max_queue_requests, remote.max_batch),
    )
    return settings, remote.max_in_flight


async def start_batcher(config: RouterConfig, factory: BackendFactory | None = None,
                        batch_hook: BatchHook | None = None) -> ContinuousBatcher:
    """The backend (loaded off the event loop: seconds of blocking work) and its warmed-up batcher."""
    loop = asyncio.get_running_loop()
    backend = await loop.run_in_executor(None, factory or make_backend, config)
    settings, lanes = batcher_shape(config)
    batcher = ContinuousBatcher(backend, settings, PrometheusBatchObserver(), lanes)
    batcher.batch_hook = batch_hook
    batcher.start(loop)
    await batcher.started()  # warm-up runs on the model thread
    return batcher

