"""Model selection by predicted quality and price on held-out prompts (issue 59's targets): a score
matrix over CLINC150 (esr_tuning/score_matrix.synthetic: five models at 1-50x price, per-domain
competence, per-prompt difficulty; or a team's rows with --rows), prompts embedded by the bundled
encoder, a predictor fitted on train prompts and judged on val prompts. Per predictor (ridge on the
encoder's vectors, ridge on the static tier's, kNN):

- cost at 95% of the strongest model's mean score, against always the strongest (target <= 0.4x);
- mean score at the cost of each single model, against that model and against a random mix of the
  two models whose prices bracket it, with a bootstrap 95% interval of the difference;
- APGR, RouteLLM's average performance gap recovered (cheapest to strongest), against the oracle's
  (target >= 0.8 of it);
- floor violations at alpha = 0.1 (cheapest_meeting_floor): the share of requests whose chosen
  model scored under the floor (target <= alpha + 0.02), and the share the floor could not be met for;
- with feedback on: a model whose scores halve from request 3,000 on, how many requests until its
  share of traffic has halved (target <= 2,000).

    python -m bench.quality.selection_bench [--train 4000] [--floor 0.7] [--seed 0] [--out r.json]
"""

from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np

from bench.report import emit
from bench.workloads import SHARED
from esr_tuning.selection_eval import evaluate

COLUMNS = ("predictor", "cost_at_95pct", "oracle_cost_at_95pct", "apgr", "apgr_of_oracle", "floor_violations", "floor_unmet",
           "beats_best_single", "beats_random_mix", "fit_s")


def drift(quality, vectors: np.ndarray, scores: np.ndarray, prices: np.ndarray, floor: float, seed: int,
          at: int = 3000, after: int = 4000, window: int = 500) -> dict:
    """Feedback against a model that got worse: prompts stream through the serving Selector with
    feedback on (its defaults), every answer scored as the matrix says; from request `at` on, the
    model served most so far scores half. How many requests until its share of a `window` has halved;
    and Selector.order's time a request with feedback and without it (interleaved, the median)."""
    from router.config import SelectionFeedbackConfig
    from router.feedback import FeedbackBook, SelectionIds
    from router.selection import Feedback, Selector

    defaults = SelectionFeedbackConfig()
    rng = np.random.default_rng(seed)
    token = b"bench-token-bench-token"
    feedback = Feedback(FeedbackBook(defaults.half_life, defaults.prior), SelectionIds(token, 3600), defaults.explore,
                        defaults.path, token, draw=random.Random(seed).random)  # the draw serving makes
    models = quality.models
    by_price = dict(zip(models, prices.tolist()))
    selector = Selector(quality, "cheapest_meeting_floor", by_price, floor, None, 0.0, feedback)
    plain = Selector(quality, "cheapest_meeting_floor", by_price, floor, None, 0.0)
    order = rng.integers(0, len(vectors), at + after)
    chosen = np.empty(at + after, dtype=np.int64)
    worse, explored, spent, spent_plain = -1, 0, [], []
    for n, i in enumerate(order):
        if n == at:
            worse = int(np.bincount(chosen[:at], minlength=len(models)).argmax())
        started = time.perf_counter()
        plain.order(models, vectors[i], "route")
        spent_plain.append(time.perf_counter() - started)
        started = time.perf_counter()
        picked = selector.order(models, vectors[i], "route")
        spent.append(time.perf_counter() - started)
        m = models.index(picked.models[0])
        chosen[n], explored = m, explored + picked.explored
        score = scores[i, m] * (0.5 if m == worse else 1.0)
        issued = feedback.ids.verify(picked.selection_id)
        feedback.book.add(issued.route, issued.model, issued.predicted, float(score))
    before = float(np.mean(chosen[at - 1000:at] == worse))
    share = [float(np.mean(chosen[at + k - window:at + k] == worse)) for k in range(window, after + 1, 50)]
    halved = next((window + 50 * j for j, v in enumerate(share) if v <= before / 2), None)
    return {"worse": models[worse], "share_before": round(before, 3), "share_last_window": round(share[-1], 3),
            "requests_to_halve": halved, "window": window, "explored": round(explored / len(order), 4),
            "order_ms": round(float(np.median(spent)) * 1000, 4),
            "order_ms_plain": round(float(np.median(spent_plain)) * 1000, 4)}


def main() -> None:
    from esr_app.quality_cli import offline
    from esr_config import load_config
    from esr_tuning.score_matrix import matrix, read_rows, synthetic
    from esr_tuning.selection_fit import Knn, fit_quality
    from devstack.stack import ROOT

    p = argparse.ArgumentParser(prog="python -m bench.quality.selection_bench")
    p.add_argument("--train", type=int, default=4000)
    p.add_argument("--floor", type=float, default=0.7)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rows", help="a team's score rows (JSONL); default: the synthetic matrix over CLINC150")
    p.add_argument("--out")
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    if args.rows:
        m = matrix(read_rows(args.rows))
        order = rng.permutation(len(m.prompts))
        cut = int(0.7 * len(order))
        train, test = m.subset(order[:cut]), m.subset(order[cut:])
    else:
        def load(name):
            return [json.loads(line) for line in open(SHARED / "clinc150" / f"{name}.jsonl")]
        # Each text once (the matrix holds a prompt once: a text in both sets, or twice, would shift
        # the split), the held-out ones never among the trained.
        test_rows = list({r["text"]: r for r in load("val")}.values())
        held_out = {r["text"] for r in test_rows}
        every_train = [r for r in {r["text"]: r for r in load("train")}.values() if r["text"] not in held_out]
        train_rows = [every_train[i] for i in rng.permutation(len(every_train))[: args.train]]
        rows = train_rows + test_rows
        every = matrix(synthetic([r["text"] for r in rows], [r["label"] for r in rows], [r["intent"] for r in rows],
                       seed=args.seed))
        train, test = every.subset(np.arange(len(train_rows))), every.subset(np.arange(len(train_rows), len(rows)))
    encoder, _ = offline(load_config(ROOT / "router.yaml"))
    x_train, x_test = encoder.encode(train.prompts), encoder.encode(test.prompts)
    results = []
    started = time.perf_counter()
    quality = fit_quality(train.models, x_train, train.scores, alpha=args.alpha, seed=args.seed)
    fit_s = time.perf_counter() - started
    results.append({**evaluate("ridge", quality.predict(x_test), quality.margins, test.scores, test.costs, args.floor,
                               args.alpha, args.seed), "fit_s": round(fit_s, 2)})
    from esr_app.routing_build import static_tier
    tier = static_tier(load_config(ROOT / "router.yaml"))
    if tier is not None:  # the same predictor on the static tier's vectors (the requests it decides)
        s_train, s_test = tier.encode(train.prompts), tier.encode(test.prompts)
        started = time.perf_counter()
        static = fit_quality(train.models, s_train, train.scores, alpha=args.alpha, seed=args.seed)
        fit_s = time.perf_counter() - started
        results.append({**evaluate("ridge-static", static.predict(s_test), static.margins, test.scores, test.costs,
                                   args.floor, args.alpha, args.seed), "fit_s": round(fit_s, 2)})
    started = time.perf_counter()
    cut = int(0.75 * len(x_train))
    knn_cal = Knn(x_train[:cut], train.scores[:cut])
    from esr_tuning.selection_fit import margins as conformal
    knn_margins = conformal(knn_cal.predict(x_train[cut:]), train.scores[cut:], args.alpha)
    knn = Knn(x_train, train.scores)
    fit_s = time.perf_counter() - started
    results.append({**evaluate("knn25", knn.predict(x_test), knn_margins, test.scores, test.costs, args.floor,
                               args.alpha, args.seed), "fit_s": round(fit_s, 2)})
    moved = drift(quality, x_test, test.scores, test.costs, args.floor, args.seed)
    print(f"feedback: {moved['worse']} scored half from request 3000 on: its share {moved['share_before']} -> "
          f"{moved['share_last_window']}, halved within {moved['requests_to_halve']} requests (windows of "
          f"{moved['window']}); explored {moved['explored']:.2%}; Selector.order {moved['order_ms_plain']} ms, with feedback {moved['order_ms']} ms")
    emit({"bench": "selection", "train": len(train.prompts), "test": len(test.prompts), "models": train.models,
          "rows": results, "feedback_drift": moved}, args.out, COLUMNS)


if __name__ == "__main__":
    main()
