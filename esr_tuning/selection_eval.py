"""Model selection judged on held-out score rows, where every model's score of every prompt is known:
what a predictor's choices cost and score against always one model, a random mix of two, and the
oracle (which knows the scores). `semantic-router select-eval` reports it (and draws the curve) for
a config's quality model; `bench/quality/selection_bench.py` for the predictors it compares."""

from __future__ import annotations

import numpy as np

from router.selection import Strategy, rank


def curve_of(chosen_scores: list[np.ndarray], chosen_costs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(mean cost, mean score) per policy setting, the upper envelope sorted by cost."""
    cost = np.asarray([c.mean() for c in chosen_costs])
    score = np.asarray([s.mean() for s in chosen_scores])
    order = np.argsort(cost)
    cost, score = cost[order], np.maximum.accumulate(score[order])
    return cost, score


def sweep(utility: np.ndarray, scores: np.ndarray, prices: np.ndarray, lams: np.ndarray):
    """Each lambda's choice by `utility` (n, models) less lambda x relative price: (scores, costs)."""
    rel = prices / prices.min()
    rows = np.arange(len(scores))
    chosen_scores, chosen_costs = [], []
    for lam in lams:
        pick = np.argmax(utility - lam * rel, axis=1)
        chosen_scores.append(scores[rows, pick])
        chosen_costs.append(prices[pick])
    return chosen_scores, chosen_costs


def apgr_of(cost: np.ndarray, score: np.ndarray, weak: tuple[float, float], strong: tuple[float, float]) -> float:
    """Mean over costs from the cheapest model's to the strongest's of the share of the quality gap
    between them the curve recovers (RouteLLM's APGR, on cost rather than calls to the strong model)."""
    grid = np.linspace(weak[0], strong[0], 200)
    at = np.interp(grid, cost, score, left=weak[1], right=score[-1])
    return float(np.mean(np.clip((at - weak[1]) / (strong[1] - weak[1]), -1.0, 1.5)))


def evaluate(name: str, predicted: np.ndarray, margins: np.ndarray, scores: np.ndarray, prices: np.ndarray,
             floor: float, alpha: float, seed: int, strategy: Strategy = "cheapest_meeting_floor",
             budget: float | None = None, lam: float = 0.0) -> dict:
    """How a predictor's choices fare on held-out rows whose every score is known (see the module):
    the quality-cost curve (`curve`: the utility strategy over a sweep of lambda), the oracle's,
    each single model, APGR and cost at 95% of the strongest, against single models and random mixes
    with bootstrap intervals, floor violations, and the operating point of the configured policy."""
    lams = np.concatenate([[0.0], np.geomspace(1e-5, 1.0, 80)])
    cost, curve = curve_of(*sweep(predicted, scores, prices, lams))
    o_cost, o_curve = curve_of(*sweep(scores, scores, prices, lams))
    means = scores.mean(axis=0)
    strongest, cheapest = int(np.argmax(means)), int(np.argmin(prices))
    weak, strong = (prices[cheapest], means[cheapest]), (prices[strongest], means[strongest])
    reach = curve >= 0.95 * means[strongest]
    cost_95 = float(cost[np.argmax(reach)] / prices[strongest]) if reach.any() else float("nan")
    o_reach = o_curve >= 0.95 * means[strongest]
    oracle_95 = float(o_cost[np.argmax(o_reach)] / prices[strongest]) if o_reach.any() else float("nan")
    # APGR needs a gap to recover: none where the cheapest model is also the strongest
    gap = strong[1] > weak[1] and strong[0] > weak[0]
    apgr = apgr_of(cost, curve, weak, strong) if gap else float("nan")
    oracle = apgr_of(o_cost, o_curve, weak, strong) if gap else float("nan")
    # At each single model's cost: the router's score against it and against a random mix of the
    # two models that bracket that cost, with a bootstrap interval over prompts.
    rng = np.random.default_rng(seed)
    rel = prices / prices.min()
    beats_single: list[dict] = []
    beats_mix: list[dict] = []
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
    policy = np.asarray([rank(strategy, row, margins, prices, floor, budget, lam)[0] for row in predicted])
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
            "mean_score_per_model": [round(float(s), 4) for s in means],
            "curve": [[round(float(c), 4), round(float(s), 4)] for c, s in zip(cost, curve)],
            "oracle_curve": [[round(float(c), 4), round(float(s), 4)] for c, s in zip(o_cost, o_curve)],
            "policy": {"strategy": strategy, "cost": round(float(prices[policy].mean()), 4),
                       "score": round(float(scores[np.arange(len(scores)), policy].mean()), 4)}}


