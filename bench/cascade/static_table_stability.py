"""Whether the static table is the same table on another CPU: its distillation runs on the machine
that serves (`make models`), and another CPU class's GEMM kernels give the encoder's token vectors
other last bits. Stands in for that with relative noise on the token vectors, distils again, and
reports what changes: PCA components that flip sign (a head fitted over one table would read the
other's dimension backwards), how far the worst strays from its own (1 - cosine), and the static tier's decisions on
a config's traffic. Why the guard's static screen names its table by what it was made from, not by
its values (StaticEncoder.digest).

    python -m bench.cascade.static_table_stability [--config build/clinc150.fitted.yaml] \\
        [--data ../shared/data/clinc150/val.jsonl] [--out build/bench-static-table.json]
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import numpy as np

from bench.report import emit
from esr_app.routing_build import static_tier
from esr_config import load_config
from esr_model.location import resolve_model
from esr_model.static_embedding import reduced_table, token_vectors

NOISE = (0.0, 1e-7, 1e-6, 1e-5)
COLUMNS = ("relative_noise", "components_flipped", "worst_component_1_minus_cos", "decisions_changed", "prompts")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.cascade.static_table_stability")
    p.add_argument("--config", type=Path, default=Path("router.yaml"))
    p.add_argument("--data", type=Path, default=Path("../shared/data/clinc150/val.jsonl"))
    p.add_argument("--out")
    args = p.parse_args()
    config = load_config(args.config)
    tier = static_tier(config)
    if tier is None:
        raise SystemExit(f"{args.config}: no static tier serves this config")
    served = tier.embedding
    texts = [json.loads(line)["text"] for line in args.data.read_text().splitlines() if line.strip()]
    vectors = token_vectors(resolve_model(config.encoder.model))
    base = reduced_table(vectors)
    trained = np.any(served.table != base, axis=1)  # rows a routing fit laid over the distilled table
    before = [tier.decide([t]) for t in texts]
    rng = np.random.default_rng(0)
    rows = []
    for noise in NOISE:
        table = reduced_table(vectors * (1 + noise * rng.standard_normal(vectors.shape)).astype(np.float32))
        ours, theirs = base.astype(np.float64), table.astype(np.float64)
        cosines = (ours * theirs).sum(0) / np.linalg.norm(ours, axis=0) / np.linalg.norm(theirs, axis=0)
        other = copy.copy(served)
        other.table = np.where(trained[:, None], served.table, table)
        moved = static_tier(config, other.encode)
        after = [moved.decide([t]) for t in texts] if noise else before
        changed = sum((a is None) != (b is None) or (a is not None and b is not None and a.route != b.route)
                      for a, b in zip(before, after))
        rows.append({"relative_noise": f"{noise:.0e}", "components_flipped": int((cosines < 0).sum()),
                     "worst_component_1_minus_cos": f"{1 - np.abs(cosines).min():.1e}",
                     "decisions_changed": changed,
                     "prompts": len(texts)})
    emit({"benchmark": "static_table_stability", "config": str(args.config), "data": str(args.data),
          "trained_rows": int(trained.sum()), "rows": rows}, args.out, COLUMNS)


if __name__ == "__main__":
    main()
