"""Where a config's model runs: its runtime (ONNX Runtime or torch), whether on a GPU, and whether
the static tier serves beside it. Decided without loading the model."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from esr_config import RouterConfig


def runtime(config: RouterConfig) -> str:
    """`encoder.backend` resolved: auto is torch only where there is CUDA to run it on."""
    backend, device = config.encoder.backend, config.encoder.device
    if backend != "auto":
        return backend
    if device.startswith("cuda"):
        return "torch"
    # No NVIDIA device node, no CUDA: decided without importing torch (seconds, and memory).
    if device == "auto" and os.path.exists("/dev/nvidiactl") and importlib.util.find_spec("torch") is not None:
        import torch

        return "torch" if torch.cuda.is_available() else "onnx"
    return "onnx"


def on_gpu(config: RouterConfig) -> bool:
    """Whether the model this config loads here runs on a CUDA device."""
    device = config.encoder.device
    if config.encoder.remote is not None or runtime(config) != "torch":
        return False
    if device != "auto":
        return device.startswith("cuda")
    import torch

    return torch.cuda.is_available()


def static_tier_on(config: RouterConfig) -> bool:
    """static_tier.enabled resolved: auto is on where the encoder runs in this router, on the CPU
    (ONNX) or on CUDA where the model's static table is there or can be made (its ONNX export):
    even on a GPU an encoder decision pays the batcher's and the kernel launches' fixed cost, which a
    static decision skips (docs/static-tier.md, "On a GPU"; figures in "What it costs now").
    Behind a model process on this machine (`encoder.socket`: a pool's workers) it is on where the
    model's static table is already made: each worker reads it, none distils its own. Off with a
    remote engine, whose weights need not be the local copy's."""
    enabled = config.static_tier.enabled
    if enabled != "auto":
        return bool(enabled)
    encoder = config.encoder
    if encoder.remote is not None:
        return False
    if encoder.socket is not None:
        return _static_table_made(encoder.model)
    return runtime(config) == "onnx" or _static_table_at_hand(encoder.model)


def _static_table_made(spec: str) -> bool:
    from esr_model.location import resolve_model
    from esr_model.static_embedding import is_current

    return _local(spec) and is_current(Path(resolve_model(spec)))


def _local(spec: str) -> bool:
    return spec.startswith("bundled:") or Path(spec).is_dir()  # else a hub name: nothing local to distil from


def _static_table_at_hand(spec: str) -> bool:
    """A torch encoder's model has a static table, or an ONNX export to distil one from: a GPU image
    built without the export serves as before, without the tier, rather than failing to start."""
    from esr_model.location import export_path, resolve_model
    from esr_model.static_embedding import is_current

    if not _local(spec):
        return False
    model_dir = Path(resolve_model(spec))
    return is_current(model_dir) or export_path(model_dir).is_file()
