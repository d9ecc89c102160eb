"""The `encoder` section's keys for a model run in this process."""

from __future__ import annotations

import re
from dataclasses import dataclass

from esr_settings import require

_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")


@dataclass(frozen=True)
class ModelConfig:
    model: str = "bundled:all-MiniLM-L6-v2"  # bundled:NAME, a local path, or a hub name
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # The model runtime. onnx: ONNX Runtime on the CPU, no torch (the model's export, made by
    # `semantic-router export` / make models). torch: sentence-transformers (CPU or CUDA). auto:
    # torch where the device is (or auto finds) CUDA, else onnx.
    backend: str = "auto"
    # onnx only: int8 (MatMuls in int8 with a scale per token, so batch-independent: more routed
    # req/s for less CPU, slightly different routes; docs/benchmarks.md, "Model runtime") or fp32.
    # auto: fp32 (the same vectors as torch), the model's own on torch.
    precision: str = "auto"
    max_seq_length: int | None = None  # None: the model's own limit
    cpu_threads: int | None = None  # None: chosen per batch from the CPUs the process may use (thread_policy)
    half_precision: bool = True  # fp16 on CUDA; ignored on CPU
    cpu_bf16: bool = False  # bf16 autocast on CPU: faster where the CPU has bf16 units, slightly different scores
    torchscript: bool = True  # CPU: run the model as one traced graph (checked against eager at load)
    # CUDA: replay forward passes captured per batch and length bucket (checked against eager at
    # load; eager where capture fails): one host call a batch instead of one per kernel.
    cuda_graphs: bool = True

    def __post_init__(self):
        require(bool(_DEVICE.match(self.device)), "device", f"must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        require(self.backend in ("auto", "torch", "onnx"), "backend", f"must be auto, torch or onnx, got {self.backend!r}")
        require(not (self.backend == "onnx" and self.device.startswith("cuda")), "backend",
                 "onnx runs on the CPU: use backend torch (or auto) for a CUDA device")
        require(self.precision in ("auto", "fp32", "int8"), "precision",
                 f"must be auto, fp32 or int8, got {self.precision!r}")
        require(not (self.precision == "int8" and self.backend == "torch"), "precision",
                 "int8 is the ONNX Runtime export's: use backend onnx (or auto on a CPU)")
        require(self.max_seq_length is None or self.max_seq_length >= 8, "max_seq_length", "must be at least 8")
        require(self.cpu_threads is None or self.cpu_threads >= 1, "cpu_threads", "must be at least 1")
