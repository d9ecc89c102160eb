"""Guard data for `make guard`: labelled attacks and hard negatives, and benign traffic, as JSONL.

Sources (nothing of them is committed; their licenses and credits travel with what is written):
- bastioncorpus 0.6.0 (PyPI; MIT, Stefano Rizzello, github.com/Rinkia/bastioncorpus): 118 malicious
  prompts (direct and indirect injection, jailbreak personas, exfiltration, obfuscation) -> block,
  63 benign false-positive traps -> allow; each keeps its category.
- CLINC150 (Larson et al., EMNLP 2019; CC BY 3.0): user prompts -> allow (category clinc150).
- Schema-Guided Dialogue (Rastogi et al., AAAI 2020; CC BY-SA 4.0): conversations, one request per
  user turn with every earlier message (the guard reads them all) -> allow (category sgd).

    python examples/guard/build_data.py --clinc ../shared/data/clinc150/train.jsonl \
        --sgd ../shared/data/sgd/train.jsonl --out build/guard.train.jsonl
    python examples/guard/build_data.py --bastion-only --malicious --out build/guard.bastion.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

CREDIT = ("bastioncorpus 0.6.0 (MIT, Stefano Rizzello); CLINC150 (Larson et al. 2019, CC BY 3.0); "
          "Schema-Guided Dialogue (Rastogi et al. 2020, CC BY-SA 4.0)")
CANARY = "ZX-4417-QK"  # the corpus's {canary} placeholder, filled as an attacker would


def bastion(malicious_only: bool = False) -> list[dict]:
    try:
        from bastioncorpus import load_corpus
    except ImportError:
        raise SystemExit("needs bastioncorpus: pip install bastioncorpus==0.6.0 (make guard installs it)") from None
    rows = []
    for row in load_corpus():
        row = row if isinstance(row, dict) else vars(row)
        block = row["label"] == "malicious"
        if malicious_only and not block:
            continue
        rows.append({"text": row["text"].replace("{canary}", CANARY), "label": "block" if block else "allow",
                     "category": row["category"]})
    return rows


def clinc(path: Path, limit: int, rng: random.Random) -> list[dict]:
    texts = sorted({json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()})
    rng.shuffle(texts)
    return [{"text": t, "label": "allow", "category": "clinc150"} for t in texts[:limit]]


def sgd(path: Path, limit: int, rng: random.Random) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rng.shuffle(rows)
    out = []
    for row in rows[:limit]:
        users = sum(m["role"] == "user" for m in row["messages"])
        out.append({"messages": row["messages"], "labels": ["allow"] * users, "category": "sgd"})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clinc", type=Path)
    parser.add_argument("--sgd", type=Path)
    parser.add_argument("--clinc-limit", type=int, default=100000)
    parser.add_argument("--sgd-limit", type=int, default=600, help="dialogues")
    parser.add_argument("--bastion-only", action="store_true")
    parser.add_argument("--no-bastion", action="store_true")
    parser.add_argument("--malicious", action="store_true", help="only bastioncorpus's malicious rows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rows = [] if args.no_bastion else bastion(args.malicious)
    if not args.bastion_only:
        rows += clinc(args.clinc, args.clinc_limit, rng) if args.clinc else []
        rows += sgd(args.sgd, args.sgd_limit, rng) if args.sgd else []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"wrote {args.out}: {len(rows)} records ({CREDIT})")


if __name__ == "__main__":
    main()
