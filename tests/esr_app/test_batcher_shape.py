"""The batcher's settings per device: on a GPU `auto` means wide batches (128, padding no bar), on a
CPU the CPU's (64, a quarter padding at most); a value the config sets is kept either way."""

from __future__ import annotations

from esr_app.embedding import batcher_shape
from esr_config import load_config
from esr_settings import replace_at
from tests.support import ROOT


def _settings(device: str, **batching):
    config = replace_at(load_config(ROOT / "router.yaml"), "encoder", device=device,
                        backend="torch" if device == "cuda" else "onnx")
    if batching:
        config = replace_at(config, "batching", **batching)
    return batcher_shape(config)[0]


def test_auto_is_wide_on_a_gpu_and_narrow_on_a_cpu():
    cpu, gpu = _settings("cpu"), _settings("cuda")
    assert (cpu.batch_size, cpu.padding) == (64, 0.25)
    assert (gpu.batch_size, gpu.padding) == (128, 1.0)


def test_what_the_config_sets_is_kept_on_a_gpu():
    gpu = _settings("cuda", max_batch_size=32, max_padding=0.5)
    assert (gpu.batch_size, gpu.padding) == (32, 0.5)
    assert _settings("cuda", max_queue_requests=100).batch_size == 100  # never more than the queue holds
