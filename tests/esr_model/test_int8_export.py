"""int8 is optional and right where it is offered: the export makes the fp32 graph whatever int8 can do
on this CPU, says in one log line and in source.json why there is no int8 graph, and a server asked
for int8 refuses one its CPU does not compute exactly with a config error that names the CPU; on the
CPU that runs the suite, the bundled model's int8 graph is there and close to fp32 on CLINC150 prompts."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from esr_config import ConfigError, EncoderConfig
from esr_model import int8_kernels
from esr_model.location import EXPORT_SOURCE, export_is_current, export_path, export_record, resolve_model
from esr_model.onnx_encoder import OnnxEncoder
from tests.support import ROOT

BUNDLED = Path(resolve_model("bundled:all-MiniLM-L6-v2"))
CLINC_VAL = ROOT.parent / "shared" / "data" / "clinc150" / "val.jsonl"


def model_copy(tmp_path: Path, with_export: bool) -> Path:
    """The bundled model in tmp_path, its large files linked rather than copied."""
    copy = tmp_path / "model"
    shutil.copytree(BUNDLED, copy, ignore=shutil.ignore_patterns("*.safetensors", "onnx"))
    (copy / "model.safetensors").symlink_to(BUNDLED / "model.safetensors")
    if with_export:
        (copy / "onnx").mkdir()
        for name in ("model.onnx", "model_int8.onnx"):
            (copy / "onnx" / name).symlink_to(BUNDLED / "onnx" / name)
        shutil.copy(BUNDLED / "onnx" / EXPORT_SOURCE, copy / "onnx" / EXPORT_SOURCE)
    return copy


@pytest.mark.slow
def test_where_no_int8_format_is_exact_the_export_makes_fp32_and_says_why(tmp_path, monkeypatch, caplog):
    from esr_model.export import export

    copy = model_copy(tmp_path, with_export=False)
    (copy / "onnx").mkdir()
    export_path(copy, "int8").write_bytes(b"an older export's int8 graph")
    monkeypatch.setattr(int8_kernels, "is_exact", lambda fmt: False)  # a CPU whose int8 GEMM saturates
    with caplog.at_level(logging.INFO, logger="esr_model"):
        export(str(copy))

    assert export_path(copy).is_file() and not export_path(copy, "int8").exists()
    assert export_is_current(copy)
    here = int8_kernels.this_cpu()
    record = export_record(copy)["int8"]
    assert record["cpu"] == here.cpu and "exact in no format" in record["unavailable"]
    # the export's own records (a worker's session stack logs beside it)
    said = [r for r in caplog.records if r.name.startswith("esr_model") and r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in said] == ["int8 export not made: encoder.precision int8 is unavailable for this model"]
    assert said[0].cpu == here.cpu and here.why in said[0].reason

    with pytest.raises(ConfigError, match=r"encoder.precision: int8 is unavailable") as refused:
        OnnxEncoder(EncoderConfig(model=str(copy), backend="onnx", precision="int8", cpu_threads=1))
    assert here.cpu in str(refused.value) and "fp32" in str(refused.value)
    fp32 = OnnxEncoder(EncoderConfig(model=str(copy), backend="onnx", cpu_threads=1))  # the default still serves
    assert fp32.encode(["what is my credit score"]).shape == (1, 384)


def test_an_int8_export_is_refused_on_a_cpu_that_does_not_compute_its_format_exactly(tmp_path, monkeypatch):
    copy = model_copy(tmp_path, with_export=True)
    record = export_record(copy)
    # as the image's build stage on a VNNI machine writes it, served on a node without VNNI
    record["int8"] = {"format": "u8s8", "cpu": "x86-64 with AVX-512 VNNI", "min_cosine": 0.998}
    (copy / "onnx" / EXPORT_SOURCE).write_text(json.dumps(record))
    assert export_is_current(copy)
    monkeypatch.setattr(int8_kernels, "is_exact", lambda fmt: fmt != "u8s8")
    with pytest.raises(ConfigError, match=r"encoder.precision: int8: .* is u8s8 \(made on x86-64 with AVX-512 VNNI\)"
                                          r".*does not compute exactly.*Re-export it on this CPU") as refused:
        OnnxEncoder(EncoderConfig(model=str(copy), backend="onnx", precision="int8", cpu_threads=1))
    assert int8_kernels.this_cpu().cpu in str(refused.value)

    monkeypatch.setattr(int8_kernels, "is_exact", lambda fmt: True)  # a node that computes it exactly serves it
    assert OnnxEncoder(EncoderConfig(model=str(copy), backend="onnx", precision="int8", cpu_threads=1)).precision == "int8"


@pytest.mark.slow
def test_the_bundled_int8_graph_is_made_on_this_cpu_and_close_to_fp32_on_clinc150_prompts():
    here = int8_kernels.this_cpu()
    record = export_record(BUNDLED).get("int8", {})
    assert record.get("format") == here.format, (
        f"make models made no {here.format} int8 graph on this CPU ({here.cpu}): source.json says {record}")
    if not CLINC_VAL.exists():
        pytest.fail(f"CLINC150 data missing at {CLINC_VAL} (it ships in ../shared beside the project)", pytrace=False)
    texts = [json.loads(line)["text"] for line in CLINC_VAL.read_text().splitlines()][::10]  # 310, every intent
    int8, fp32 = (OnnxEncoder(EncoderConfig(backend="onnx", precision=p, cpu_threads=2)).encode(texts)
                  for p in ("int8", "fp32"))
    cos = (int8 * fp32).sum(axis=1)  # unit vectors
    assert cos.min() >= 0.99 and cos.mean() >= 0.998, f"min {cos.min():.4f}, mean {cos.mean():.5f}"
    assert cos.mean() < 0.99999  # the int8 graph, not the fp32 one by mistake
    assert np.isfinite(int8).all()


@pytest.mark.processes
def test_serve_with_int8_where_there_is_none_exits_with_one_config_error(tmp_path):
    copy = model_copy(tmp_path, with_export=True)
    (copy / "onnx" / "model_int8.onnx").unlink()
    record = export_record(copy)
    record["int8"] = {"unavailable": "ONNX Runtime's int8 GEMM is exact in no format on this CPU (x86-64 with AVX2, "
                                     "no VNNI: no avx512_vnni or avx_vnni)", "cpu": "x86-64 with AVX2, no VNNI"}
    (copy / "onnx" / EXPORT_SOURCE).write_text(json.dumps(record))
    config = yaml.safe_load((ROOT / "router.yaml").read_text())
    config["encoder"] = {**config.get("encoder", {}), "model": str(copy), "backend": "onnx", "precision": "int8"}
    config["server"] = {**config.get("server", {}), "grpc_port": 0, "metrics_port": 0}
    (tmp_path / "router.yaml").write_text(yaml.safe_dump(config))
    out = subprocess.run([sys.executable, "-m", "esr_app", "serve", "--config", str(tmp_path / "router.yaml")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr[-2000:]
    assert out.stderr.startswith("error: encoder.precision: int8 is unavailable") and "avx512_vnni" in out.stderr
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr[-2000:]
