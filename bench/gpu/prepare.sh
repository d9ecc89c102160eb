#!/usr/bin/env bash
# Run HERE (a machine with the package registries and `make` done), once per session that is lent
# a GPU: fills .gpu/ (git-ignored; carried to the device machine with `carry: [".gpu"]`) with what
# the GPU image lacks. Under 64 MiB with the tree: the wheels the router imports that the image
# does not hold (Python 3.12), and the bundled model with its weights in fp16 (the fp32 file alone is
# 91 MB; run.sh widens them back to fp32 there).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/whl .gpu/model
for pkg in xds-protos grpcio grpcio-health-checking protobuf brotli zstandard; do
  pin=$(grep -iE "^${pkg}==" requirements-runtime.lock | sed 's/ .*//')
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu/whl "$pin"
done
.venv/bin/python - "$ROOT/.gpu/model" <<'PY'
import shutil, sys
from pathlib import Path
from safetensors.torch import load_file, save_file
from esr_model.location import resolve_model
src, dst = Path(resolve_model("bundled:all-MiniLM-L6-v2")), Path(sys.argv[1])
for f in src.rglob("*"):
    rel = f.relative_to(src)
    if f.is_dir() or rel.parts[0] == "onnx" or f.name == "model.safetensors" or f.suffix == ".md":
        continue
    (dst / rel).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(f, dst / rel)
weights = load_file(str(src / "model.safetensors"))
save_file({k: v.half() for k, v in weights.items()}, str(dst / "model.safetensors"), metadata={"format": "pt"})
PY
# Held-out accuracy on the GPU against the CPU: CLINC150 few-shot (10 utterances per intent from train),
# fitted on val's even lines, scored there on its odd lines (CC BY 3.0; it stays in the ignored .gpu/).
CLINC=${CLINC:-../shared/data/clinc150}
mkdir -p .gpu/clinc
awk 'NR%2==0' $CLINC/val.jsonl > .gpu/clinc/fit.jsonl
awk 'NR%2==1' $CLINC/val.jsonl > .gpu/clinc/heldout.jsonl
.venv/bin/python examples/clinc150/build_config.py --train $CLINC/train.jsonl --per-intent 10 --out .gpu/clinc/few.yaml
.venv/bin/semantic-router fit --config .gpu/clinc/few.yaml --data .gpu/clinc/fit.jsonl --out .gpu/clinc/few.fitted.yaml
du -sh .gpu .gpu/* && echo "now: run(command='bash bench/gpu/run.sh', carry=['.gpu'], timeout_s=540)"
