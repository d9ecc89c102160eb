"""Routing quality of the model runtimes side by side: the quality recipes (`make clinc150`,
`make clinc150-fewshot`, `make sgd`) run with encoder backend torch, onnx fp32 and onnx int8, every
figure `eval --json` prints compared with torch's (target: within 0.005).

    python -m bench.runtime.precision_quality [--recipes clinc150 clinc150-fewshot sgd] [--finetune] [--out result.json]

clinc150 evaluates the generated config on val, then fits a head on train (`--finetune` adds the
recipe's encoder fine-tuning, whose model is exported to both ONNX precisions: tens of minutes);
clinc150-fewshot fits thresholds on val; sgd evaluates on dev, then fits a head on train.
Data: ../shared (CLINC150, CC BY 3.0; SGD, CC BY-SA 4.0), read in place, never copied.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from bench.report import emit
from devstack.stack import ROOT

DATA = ROOT.parent / "shared" / "data"
CLINC, SGD = DATA / "clinc150", DATA / "sgd"
RUNTIMES = {"torch": {"backend": "torch", "device": "cpu"}, "onnx_fp32": {"backend": "onnx", "precision": "fp32"},
            "onnx_int8": {"backend": "onnx", "precision": "int8"}}
FIGURES = ("accuracy", "in_scope_accuracy", "default_recall")
TOLERANCE = 0.005


def cli(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "esr_app", *args], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "SEMANTIC_ROUTER_LOG_LEVEL": "warning"})
    if out.returncode:
        raise SystemExit(f"semantic-router {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return out.stdout


def with_encoder(config: Path, encoder: dict, out: Path) -> Path:
    data = yaml.safe_load(config.read_text())
    data["encoder"] = {**data.get("encoder", {}), **encoder}
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def evaluate(config: Path, data: Path) -> dict:
    report = json.loads(cli("eval", "--config", str(config), "--data", str(data), "--json"))
    figures = {k: report[k] for k in FIGURES if isinstance(report.get(k), (int, float))}
    shifted = report.get("shifted")
    if isinstance(shifted, dict) and isinstance(shifted.get("accuracy"), (int, float)):
        figures["shifted_accuracy"] = shifted["accuracy"]
    return figures


def fit(base: Path, data: Path, out: Path, *flags: str) -> None:
    if not out.exists():  # a resumed run (--workdir) keeps what an earlier one fitted
        cli("fit", "--config", str(base), "--data", str(data), *flags, "--out", str(out))


def recipe(name: str, runtime: str, work: Path, finetune: bool) -> dict[str, dict]:
    """stage -> figures, for one recipe under one runtime."""
    enc = RUNTIMES[runtime]
    d = work / f"{name}-{runtime}"
    d.mkdir(exist_ok=True)
    build = lambda script, train, *extra: subprocess.run(  # noqa: E731
        [sys.executable, str(ROOT / script), "--train", str(train), "--out", str(d / "base.yaml"), *extra],
        check=True, capture_output=True, cwd=ROOT)
    if name == "clinc150":
        build("examples/clinc150/build_config.py", CLINC / "train.jsonl")
        base = with_encoder(d / "base.yaml", enc, d / "base.yaml")
        flags = ["--head", "--min-default-recall", "0.9"] + (["--finetune", "--finetune-epochs", "4"] if finetune else [])
        fit(base, CLINC / "train.jsonl", d / "fitted.yaml", *flags)
        return {"base": evaluate(base, CLINC / "val.jsonl"), "fitted": evaluate(d / "fitted.yaml", CLINC / "val.jsonl")}
    if name == "clinc150-fewshot":
        build("examples/clinc150/build_config.py", CLINC / "train.jsonl", "--per-intent", "10")
        base = with_encoder(d / "base.yaml", enc, d / "base.yaml")
        fit(base, CLINC / "val.jsonl", d / "fitted.yaml")
        return {"fitted": evaluate(d / "fitted.yaml", CLINC / "val.jsonl")}
    if name == "sgd":
        build("examples/sgd/build_config.py", SGD / "train.jsonl")
        base = with_encoder(d / "base.yaml", enc, d / "base.yaml")
        fit(base, SGD / "train.jsonl", d / "fitted.yaml", "--head")
        return {"base": evaluate(base, SGD / "dev.jsonl"), "fitted": evaluate(d / "fitted.yaml", SGD / "dev.jsonl")}
    raise SystemExit(f"unknown recipe {name!r}")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.runtime.precision_quality")
    p.add_argument("--recipes", nargs="+", default=["clinc150", "clinc150-fewshot", "sgd"])
    p.add_argument("--runtimes", nargs="+", default=list(RUNTIMES))
    p.add_argument("--finetune", action="store_true")
    p.add_argument("--workdir", type=Path, help="resume in an earlier run's directory: configs it fitted are kept")
    p.add_argument("--out")
    args = p.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-precision-"))
    print(f"working in {work}", flush=True)
    rows, checks = [], {}
    for name in args.recipes:
        results = {rt: recipe(name, rt, work, args.finetune) for rt in args.runtimes}
        for rt, stages in results.items():
            for stage, figures in stages.items():
                rows.append({"recipe": name, "stage": stage, "runtime": rt, **figures})
                print(json.dumps(rows[-1]), flush=True)
        if "torch" not in results:
            continue
        for rt in results:
            if rt == "torch":
                continue
            worst = max((abs(v - results["torch"][stage][k]), f"{stage} {k}")
                        for stage, figures in results[rt].items() for k, v in figures.items()
                        if k in results["torch"][stage])
            checks[f"{name}: {rt} within {TOLERANCE} of torch on every figure"] = {
                "ok": worst[0] <= TOLERANCE, "detail": f"largest difference {worst[0]:.4f} ({worst[1]})"}
    emit({"benchmark": "precision_quality", "rows": rows, "checks": checks}, args.out,
         columns=("recipe", "stage", "runtime", *FIGURES, "shifted_accuracy"))


if __name__ == "__main__":
    main()
