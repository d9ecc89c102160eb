"""int8 on the CPU at hand: which format the router picks (esr_model/int8_kernels.py), which formats
ONNX Runtime computes exactly here, and for each int8 format its vectors against fp32 on CLINC150 val
prompts (target: per vector >= 0.99, mean >= 0.998) and its speed against fp32 (model alone, batch 1
and batch 32, trials interleaved; prompts/s).

    python -m bench.runtime.int8_formats [--prompts 3100] [--trials 3] [--threads 2] [--out build/bench-int8-formats.json]

Every format is quantized here from the bundled model's fp32 export (`make models`), as the export
quantizes it; a format this CPU does not compute exactly is measured too and marked, to show what it
would cost. Data: ../shared/data/clinc150 (CC BY 3.0), read in place.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.report import emit
from devstack.stack import ROOT
from esr_model import int8_kernels
from esr_model.location import export_path, resolve_model
from esr_model.quantize import activation_ranges, calibration, quantize_per_token
from esr_model.tuned import pad

CLINC_VAL = ROOT.parent / "shared" / "data" / "clinc150" / "val.jsonl"
TARGET_MIN, TARGET_MEAN = 0.99, 0.998


def session(path: Path, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def batches(tokenizer, texts: list[str], size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    return [pad([e.ids[:256] for e in tokenizer.encode_batch(texts[i:i + size])], 0) for i in range(0, len(texts), size)]


def embed(s, work) -> np.ndarray:
    v = np.concatenate([s.run(None, {"input_ids": i, "attention_mask": m})[0] for i, m in work])
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def rate(s, work, n: int) -> float:
    start = time.perf_counter()
    for i, m in work:
        s.run(None, {"input_ids": i, "attention_mask": m})
    return n / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.runtime.int8_formats")
    p.add_argument("--prompts", type=int, default=3100)
    p.add_argument("--speed-prompts", type=int, default=256)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out")
    args = p.parse_args()
    from tokenizers import Tokenizer

    model_dir = Path(resolve_model("bundled:all-MiniLM-L6-v2"))
    fp32 = export_path(model_dir)
    if not fp32.is_file():
        raise SystemExit("no fp32 export: run make models")
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    texts = [json.loads(line)["text"] for line in CLINC_VAL.read_text().splitlines()[:args.prompts]]
    here = int8_kernels.this_cpu()
    exact = {f: int8_kernels.is_exact(f) for f in int8_kernels.FORMATS}
    work = Path(tempfile.mkdtemp(prefix="bench-int8-"))
    ranges = activation_ranges(fp32, calibration(tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]"),
                                                  tokenizer.get_vocab_size()))  # as the export calibrates
    paths = {"fp32": fp32}
    for fmt in int8_kernels.FORMATS:
        paths[fmt] = work / f"{fmt}.onnx"
        quantize_per_token(fp32, paths[fmt], ranges, fmt)
    sessions = {name: session(path, args.threads) for name, path in paths.items()}

    accuracy_work = batches(tokenizer, texts, 32)
    want = embed(sessions["fp32"], accuracy_work)
    speed = {"batch 1": batches(tokenizer, texts[-args.speed_prompts:], 1),
             "batch 32": batches(tokenizer, texts[-args.speed_prompts:], 32)}
    rates: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.trials):  # interleaved: this machine's speed moves between minutes
        for shape, w in speed.items():
            for name, s in sessions.items():
                rates.setdefault((name, shape), []).append(rate(s, w, args.speed_prompts))

    rows, checks = [], {}
    for name in sessions:
        row: dict = {"runtime": name, "exact_here": exact.get(name, True), "picked": name == here.format}
        if name != "fp32":
            cos = (embed(sessions[name], accuracy_work) * want).sum(axis=1)
            row.update(min_cosine=round(float(cos.min()), 4), mean_cosine=round(float(cos.mean()), 5))
        for shape in speed:
            best = max(rates[(name, shape)])
            row[f"{shape} prompts/s"] = round(best, 1)
            row[f"{shape} vs fp32"] = round(best / max(rates[("fp32", shape)]), 2)
        rows.append(row)
    picked = next(r for r in rows if r["runtime"] == here.format)
    checks[f"the picked format ({here.format}) is exact on this CPU"] = {"ok": exact[here.format], "detail": str(exact)}
    checks[f"{here.format} per vector >= {TARGET_MIN}, mean >= {TARGET_MEAN} on {len(texts)} CLINC150 val prompts"] = {
        "ok": picked["min_cosine"] >= TARGET_MIN and picked["mean_cosine"] >= TARGET_MEAN,
        "detail": f"min {picked['min_cosine']}, mean {picked['mean_cosine']}"}
    emit({"benchmark": "int8_formats", "cpu": here.cpu, "machine": platform.machine(), "why": here.why,
          "features": sorted(f for f in int8_kernels.cpu_features() if f.startswith(("avx", "amx", "asimd", "sse4"))),
          "threads": args.threads, "rows": rows, "checks": checks}, args.out,
         columns=("runtime", "exact_here", "picked", "min_cosine", "mean_cosine", "batch 1 prompts/s", "batch 1 vs fp32",
                  "batch 32 prompts/s", "batch 32 vs fp32"))


if __name__ == "__main__":
    main()
