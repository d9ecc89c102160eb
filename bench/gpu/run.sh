#!/usr/bin/env bash
# Run THERE (the device machine), from the repository root, after prepare.sh here:
#   run(command="bash bench/gpu/run.sh", carry=[".gpu"], timeout_s=540)
# Everything issue 57 measures on a GPU, in one call of about 6 minutes; each part's JSON lands in
# $OUT (the table is in the output). A part that fails says so and the next one runs.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl \
  || { echo "wheels did not install"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi -L; nproc; python3 -c "import torch, transformers, sentence_transformers as st; print('torch', torch.__version__, 'transformers', transformers.__version__, 'st', st.__version__)"

# The model in fp32 again, and its static table (the static tier's), made once here.
# A second call on the same warm machine keeps what the first one made.
MODEL=/tmp/model
if [[ ! -f $MODEL/onnx/static.npz ]]; then
rm -rf $MODEL; cp -r .gpu/model $MODEL
python3 - $MODEL <<'PY' || echo "PART FAILED: fp32 weights"
import sys
from safetensors.torch import load_file, save_file
path = sys.argv[1] + "/model.safetensors"
save_file({k: v.float() for k, v in load_file(path).items()}, path, metadata={"format": "pt"})
PY
timeout 240 python3 -c "from esr_model.export import export; export('$MODEL'); from esr_model.static_embedding import ensure_static; print(ensure_static('$MODEL'))" \
  || echo "PART FAILED: static table (the node's static-on rows will fail)"
fi

LOGS=/tmp/gpu-logs; mkdir -p $LOGS
# MP_VARIANTS, NODE_FRONT_ENDS, NODE_LOADERS: the parts' variants (see each bench's --help).
# PARTS="forward node" runs only those (a rerun inside what is left of a session's device time).
PARTS=${PARTS:-"forward model_process node c1 accuracy_cpu accuracy_cuda"}
part() { local name=$1 limit=$2; shift 2; [[ " $PARTS " == *" $name "* ]] || return 0; echo "=== $name"; local t0=$SECONDS
  timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1; local rc=$?
  grep -v '^ \|^{\|^}\|^\]\|^\[' "$LOGS/$name.log" | tail -30; echo "--- $name rc=$rc in $((SECONDS - t0)) s"
  tar czf $OUT/logs.tgz -C $LOGS . 2>/dev/null; }
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -lms 500 > $LOGS/gpu-util.csv 2>&1 &

# 1. The forward pass alone: captured graphs against eager; host time per forward.
part forward 120 python3 -m bench.gpu.gpu_forward --model $MODEL --batches 1 16 64 128 --repeats 40 --out "$OUT/forward.json"
# 2. The model process alone (socket, batcher, tokenizer): embeddings/s with four front ends' load,
#    the front ends sending token ids (as a router's do) and text.
part model_process 150 python3 -m bench.batcher.model_process_bench --model cuda --model-dir $MODEL --variants ${MP_VARIANTS:-gpu,gpu+text} \
  --loaders 4 --callers 128 --seconds 5 --trials 1 --out "$OUT/model_process.json"
# 3. The node: N front-end processes feeding the model process, ext_proc load from four processes.
part node 240 python3 -m bench.batcher.node_bench --model cuda --model-dir $MODEL --front-ends ${NODE_FRONT_ENDS:-6 10} --static off on \
  --loaders ${NODE_LOADERS:-4} --streams 64 --seconds 5 --most 25000 --trials 1 --out "$OUT/node.json"
# 4. One request at a time through one front end: the latency a lone caller sees.
part c1 90 python3 -m bench.batcher.node_bench --model cuda --model-dir $MODEL --front-ends 1 --static off on \
  --loaders 1 --streams 1 --seconds 4 --most 5000 --trials 1 --out "$OUT/c1.json"
# 5. Held-out accuracy, the same config on the GPU (fp16) and on the CPU (ONNX Runtime fp32): CLINC150
#    few-shot (10 utterances per intent, fitted on val's even lines, scored on its odd lines).
for device in cpu cuda; do
  python3 - $MODEL $device <<'PY'
import sys, yaml
config = yaml.safe_load(open(".gpu/clinc/few.fitted.yaml"))
backend = "torch" if sys.argv[2] == "cuda" else "onnx"
config["encoder"] = {**config.get("encoder", {}), "model": sys.argv[1], "device": sys.argv[2], "backend": backend}
yaml.safe_dump(config, open(f"/tmp/clinc-{sys.argv[2]}.yaml", "w"))
PY
  part accuracy_$device 120 sh -c "python3 -m esr_app eval --config /tmp/clinc-$device.yaml --data .gpu/clinc/heldout.jsonl --json > $OUT/accuracy_$device.json"
done
[[ "$PARTS" == *accuracy_cuda* ]] && python3 - "$OUT" <<'PY'
import json, sys
rows = {d: json.load(open(f"{sys.argv[1]}/accuracy_{d}.json")) for d in ("cpu", "cuda")}
for d, r in rows.items():
    print(d, {k: v for k, v in r.items() if isinstance(v, (int, float))})
PY
kill %1 2>/dev/null; tar czf $OUT/logs.tgz -C $LOGS .; echo "all parts in $SECONDS s"
