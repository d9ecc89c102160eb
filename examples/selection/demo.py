"""Model selection on the mock backends, end to end: eval rows -> select-fit -> served through Envoy ->
scores posted back -> traffic moves when a model gets worse.

    python examples/selection/demo.py build                  # rows, then select-fit: build/selection/
    SEMANTIC_ROUTER_FEEDBACK_TOKEN=demo-feedback-token-0123 make run CONFIG=build/selection/fitted.yaml
    python examples/selection/demo.py traffic [--requests 600] [--degrade-at 300]
    python examples/selection/demo.py refit                  # select-fit on rows + recorded scores, replay

The mock backends answer anything; what an answer is worth comes from GRADES below, the stand-in for
a team's grader: general-model (1/8 of math-model's price) answers math as well as it needs to and
code badly; math-model and code-model do their own topics best. Selection sends math to the cheap
model and code to code-model. `traffic` sends the held-out prompts, grades each answer by the model
that gave it, posts the score with the answer's x-semantic-selection-id, and prints per window the
cheap model's share of the math and code routes, the mean score and the spend. From --degrade-at on,
general-model's answers score half: its share of math falls as the scores come in. `refit` fits the
selector again on the rows and the scores the router recorded, and replays the records through it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "selection"
RECORDS = OUT / "records.jsonl"
PRICES = {"general-model": 1.0, "math-model": 8.0, "code-model": 10.0}
TOKEN_ENV = "SEMANTIC_ROUTER_FEEDBACK_TOKEN"
DEMO_TOKEN = "demo-feedback-token-0123"


def grade(model: str, label: str) -> float:
    """What a grader would give `model`'s answer to a prompt of topic `label`: the demo's ground truth."""
    if model == "general-model":
        return 0.45 if label == "code" else 0.9  # cheap, and good at all but code
    own = {"math-model": "math", "code-model": "code"}[model]
    return 0.95 if label == own else 0.6


def _prompts(name: str) -> list[dict]:
    return [json.loads(line) for line in (ROOT / "examples" / "default" / f"{name}.jsonl").read_text().splitlines()]


def build() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "rows.jsonl", "w") as f:
        for row in _prompts("fit"):
            for model, price in PRICES.items():
                f.write(json.dumps({"prompt": row["text"], "model": model, "score": grade(model, row["label"]),
                                    "cost": price}) + "\n")
    config = yaml.safe_load((ROOT / "router.yaml").read_text())
    for route in config["routes"]:
        route["models"] = [route.pop("model"), "general-model"]  # each topic's own model, or the cheap one
    (OUT / "router.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    fitted = OUT / "fitted.yaml"
    done = subprocess.call([sys.executable, "-m", "esr_app", "select-fit", "--config", str(OUT / "router.yaml"),
                            "--rows", str(OUT / "rows.jsonl"), "--out", str(fitted), "--floor", "0.65"], cwd=ROOT)
    if done != 0:
        return done
    # Feedback on (it corrects the quality model select-fit just wrote), quick to react for a demo.
    served = yaml.safe_load(fitted.read_text())
    served["selection"]["feedback"] = {"enabled": True, "token_env": TOKEN_ENV, "prior": 5, "half_life": 50}
    # Records with their texts: each selected request and each score taken, for `refit`.
    served["records"] = {"enabled": True, "prompts": True, "path": str(RECORDS)}
    fitted.write_text(yaml.safe_dump(served, sort_keys=False))
    print(f"now: {TOKEN_ENV}={DEMO_TOKEN} make run CONFIG={fitted.relative_to(ROOT)}\n"
          f"then: python examples/selection/demo.py traffic")
    return 0


def refit() -> int:
    """select-fit again on the eval rows and the scores the router recorded, then replay's gate on
    the same records: what the refitted selector would change."""
    if not RECORDS.exists():
        print(f"no {RECORDS.relative_to(ROOT)}: run build, make run and traffic first", file=sys.stderr)
        return 2
    refitted = OUT / "refit.yaml"
    done = subprocess.call([sys.executable, "-m", "esr_app", "select-fit", "--config", str(OUT / "fitted.yaml"),
                            "--rows", str(OUT / "rows.jsonl"), "--records", str(RECORDS), "--out", str(refitted)],
                           cwd=ROOT)
    if done != 0:
        return done
    return subprocess.call([sys.executable, "-m", "esr_app", "replay", "--config", str(refitted), "--records",
                            str(RECORDS)], cwd=ROOT)


def traffic(gateway: str, requests: int, degrade_at: int, window: int) -> int:
    import httpx

    token = os.environ.get(TOKEN_ENV, DEMO_TOKEN)
    prompts = _prompts("heldout")
    random.Random(0).shuffle(prompts)  # each window mixes the topics
    chosen: Counter = Counter()  # (route, whether the cheap model answered)
    scores: list[float] = []
    spent = 0.0
    print(f"{'requests':>8}  {'cheap share of math':>19}  {'of code':>7}  {'mean score':>10}  {'spend':>6}")
    with httpx.Client(base_url=gateway, timeout=30) as client:
        for n in range(requests):
            row = prompts[n % len(prompts)]
            r = client.post("/v1/chat/completions", json={"model": "auto", "messages": [{"role": "user", "content": row["text"]}]})
            model = r.headers.get("x-semantic-route-served-model") or r.headers.get("x-selected-model", "")
            selection_id = r.headers.get("x-semantic-selection-id")
            score = grade(model, row["label"]) if model in PRICES else 0.0
            if model == "general-model" and n >= degrade_at:
                score /= 2  # the cheap model got worse
            if selection_id:  # selection chose for it: tell the router how the answer did
                client.post("/semantic-router/feedback", json={"selection_id": selection_id, "score": score},
                            headers={"authorization": f"Bearer {token}"}).raise_for_status()
            chosen[(r.headers.get("x-semantic-route"), model == "general-model")] += 1
            scores.append(score)
            spent += PRICES.get(model, 0.0)
            if (n + 1) % window == 0:
                math, code = (chosen[(route, True)] / max(1, chosen[(route, True)] + chosen[(route, False)])
                              for route in ("math", "code"))
                print(f"{n + 1:>8}  {math:>19.2f}  {code:>7.2f}  {sum(scores) / len(scores):>10.3f}  {spent:>6.0f}"
                      + ("  <- general-model degraded from here" if n + 1 == degrade_at else ""))
                chosen.clear()
                scores.clear()
                spent = 0.0
    return 0


def main() -> int:
    p = argparse.ArgumentParser(prog="python examples/selection/demo.py")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="score rows for the mock backends, then select-fit: build/selection/fitted.yaml")
    t = sub.add_parser("traffic", help="send prompts through the gateway, grade, post feedback")
    t.add_argument("--gateway", default="http://127.0.0.1:8080")
    t.add_argument("--requests", type=int, default=600)
    t.add_argument("--degrade-at", type=int, default=300)
    t.add_argument("--window", type=int, default=50)
    sub.add_parser("refit", help="select-fit on the eval rows and the recorded scores, then replay's gate")
    args = p.parse_args()
    if args.command == "build":
        return build()
    if args.command == "refit":
        return refit()
    return traffic(args.gateway, args.requests, args.degrade_at, args.window)


if __name__ == "__main__":
    sys.exit(main())
