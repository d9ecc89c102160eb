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

    python -m bench.selection_bench [--train 4000] [--floor 0.7] [--seed 0] [--out r.json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from bench.report import emit
from bench.workloads import SHARED

COLUMNS = ("predictor", "cost_at_95pct", "oracle_cost_at_95pct", "apgr", "apgr_of_oracle", "floor_violations", "floor_unmet",
           "beats_best_single", "beats_random_mix", "fit_s")


def _curve(chosen_scores: list[np.ndarray], chosen_costs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(mean cost, mean score) per policy setting, the upper envelope sorted by cost."""
    cost = np.asarray([c.mean() for c in chosen_costs])
    score = np.asarray([s.mean() for s in chosen_scores])
    order = np.argsort(cost)
    cost, score = cost[order], np.maximum.accumulate(score[order])
    return cost, score


def _sweep(utility: np.ndarray, scores: np.ndarray, prices: np.ndarray, lams: np.ndarray):
    """Each lambda's choice by `utility` (n, models) less lambda x relative price: (scores, costs)."""
    rel = prices / prices.min()
    rows = np.arange(len(scores))
    chosen_scores, chosen_costs = [], []
    for lam in lams:
        pick = np.argmax(utility - lam * rel, axis=1)
        chosen_scores.append(scores[rows, pick])
        chosen_costs.append(prices[pick])
    return chosen_scores, chosen_costs


def _apgr(cost: np.ndarray, score: np.ndarray, weak: tuple[float, float], strong: tuple[float, float]) -> float:
    """Mean over costs from the cheapest model's to the strongest's of the share of the quality gap
    between them the curve recovers (RouteLLM's APGR, on cost rather than calls to the strong model)."""
    grid = np.linspace(weak[0], strong[0], 200)
    at = np.interp(grid, cost, score, left=weak[1], right=score[-1])
    return float(np.mean(np.clip((at - weak[1]) / (strong[1] - weak[1]), -1.0, 1.5)))


def evaluate(name: str, predicted: np.ndarray, margins: np.ndarray, scores: np.ndarray, prices: np.ndarray,
             floor: float, alpha: float, seed: int) -> dict:
    from router.selection import rank

    lams = np.concatenate([[0.0], np.geomspace(1e-5, 1.0, 80)])
    cost, curve = _curve(*_sweep(predicted, scores, prices, lams))
    o_cost, o_curve = _curve(*_sweep(scores, scores, prices, lams))
    means = scores.mean(axis=0)
    strongest, cheapest = int(np.argmax(means)), int(np.argmin(prices))
    weak, strong = (prices[cheapest], means[cheapest]), (prices[strongest], means[strongest])
    reach = curve >= 0.95 * means[strongest]
    cost_95 = float(cost[np.argmax(reach)] / prices[strongest]) if reach.any() else float("nan")
    o_reach = o_curve >= 0.95 * means[strongest]
    oracle_95 = float(o_cost[np.argmax(o_reach)] / prices[strongest]) if o_reach.any() else float("nan")
    apgr, oracle = _apgr(cost, curve, weak, strong), _apgr(o_cost, o_curve, weak, strong)
    # At each single model's cost: the router's score against it and against a random mix of the
    # two models that bracket that cost, with a bootstrap interval over prompts.
    rng = np.random.default_rng(seed)
    rel = prices / prices.min()
    beats_single, beats_mix = [], []
    by_price = np.argsort(prices)
    for m in range(len(prices)):
        lam_pick = None
        for lam in lams[::-1]:  # the largest lambda (cheapest policy) whose mean cost reaches this model's
            pick = np.argmax(predicted - lam * rel, axis=1)
            if prices[pick].mean() >= prices[m] * 0.98:
                lam_pick = pick
                break
        if lam_pick is None:
            continue
        rows = np.arange(len(scores))
        router = scores[rows, lam_pick]
        budget = prices[lam_pick].mean()
        below = [i for i in by_price if prices[i] <= budget]
        above = [i for i in by_price if prices[i] >= budget]
        lo, hi = below[-1], above[0] if above else below[-1]
        w = 0.0 if hi == lo else (budget - prices[lo]) / (prices[hi] - prices[lo])
        mix = np.where(rng.random(len(scores)) < w, scores[:, hi], scores[:, lo])
        for against, out in ((scores[:, m], beats_single), (mix, beats_mix)):
            diffs = router - against
            boot = [diffs[rng.integers(0, len(diffs), len(diffs))].mean() for _ in range(400)]
            low, high = np.percentile(boot, [2.5, 97.5])
            out.append({"model": m, "diff": round(float(diffs.mean()), 4), "ci": [round(float(low), 4), round(float(high), 4)]})
    chosen = np.asarray([rank("cheapest_meeting_floor", row, margins, prices, floor)[0] for row in predicted])
    met = (predicted - margins).max(axis=1) >= floor
    got = scores[np.arange(len(scores)), chosen]
    return {"predictor": name, "cost_at_95pct": round(cost_95, 3), "oracle_cost_at_95pct": round(oracle_95, 3),
            "apgr": round(apgr, 3),
            "apgr_of_oracle": round(apgr / oracle, 3), "oracle_apgr": round(oracle, 3),
            "floor_violations": round(float((got[met] < floor).mean()) if met.any() else float("nan"), 4),
            "floor_unmet": round(float(1 - met.mean()), 4),
            # at the cheapest model's cost the router can only be it; the strongest's cost buys it alone
            "beats_best_single": all(b["ci"][0] > 0 for b in beats_single if b["model"] not in (cheapest, strongest)),
            "beats_random_mix": all(b["ci"][0] > 0 for b in beats_mix if b["model"] not in (cheapest, strongest)),
            "vs_single": beats_single, "vs_mix": beats_mix, "alpha": alpha, "floor": floor,
            "mean_cost_per_model": [round(float(p), 2) for p in prices],
            "mean_score_per_model": [round(float(s), 4) for s in means]}


def drift(quality, vectors: np.ndarray, scores: np.ndarray, prices: np.ndarray, floor: float, seed: int,
          at: int = 3000, after: int = 4000, window: int = 500) -> dict:
    """Feedback against a model that got worse: prompts stream through the serving Selector with
    feedback on (its defaults), every answer scored as the matrix says; from request `at` on, the
    model served most so far scores half. How many requests until its share of a `window` has halved."""
    from router.config import SelectionFeedbackConfig
    from router.feedback import FeedbackBook, SelectionIds
    from router.selection import Feedback, Selector

    defaults = SelectionFeedbackConfig()
    rng = np.random.default_rng(seed)
    token = b"bench-token-bench-token"
    feedback = Feedback(FeedbackBook(defaults.half_life, defaults.prior), SelectionIds(token, 3600), defaults.explore,
                        defaults.path, token, draw=rng.random)
    models = quality.models
    selector = Selector(quality, "cheapest_meeting_floor", dict(zip(models, prices.tolist())), floor, None, 0.0, feedback)
    order = rng.integers(0, len(vectors), at + after)
    chosen = np.empty(at + after, dtype=np.int64)
    worse, explored, spent = -1, 0, []
    for n, i in enumerate(order):
        if n == at:
            worse = int(np.bincount(chosen[:at], minlength=len(models)).argmax())
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
            "order_ms": round(float(np.median(spent)) * 1000, 4)}


def main() -> None:
    from esr_app.quality_cli import offline
    from esr_config import load_config
    from esr_tuning.score_matrix import matrix, read_rows, synthetic
    from esr_tuning.selection_fit import Knn, fit_quality
    from devstack.stack import ROOT

    p = argparse.ArgumentParser(prog="python -m bench.selection_bench")
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
        every_train = load("train")
        train_rows = [every_train[i] for i in rng.permutation(len(every_train))[: args.train]]
        test_rows = load("val")
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
          f"{moved['window']}); explored {moved['explored']:.2%}; Selector.order with feedback {moved['order_ms']} ms")
    emit({"bench": "selection", "train": len(train.prompts), "test": len(test.prompts), "models": train.models,
          "rows": results, "feedback_drift": moved}, args.out, COLUMNS)


if __name__ == "__main__":
    main()
