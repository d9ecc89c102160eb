"""Where CLINC150 routing quality stops: how well each out-of-scope score separates val's out-of-scope
prompts (full recipe), and what each few-shot scoring choice gives out of sample.

CLINC150: Larson et al., EMNLP 2019, CC BY 3.0; read from ../shared/data/clinc150, nothing committed.
Needs the configs `make clinc150` and `make clinc150-fewshot` write:

    python examples/clinc150/score_study.py --out build/clinc150-study.json

Full recipe (build/clinc150.fitted.yaml, fine-tuned encoder and head): each score ranks val's prompts,
and two figures say how well out-of-scope ones fall below in-scope ones: AUROC, and the out-of-scope
recall at the threshold that keeps 95% of in-scope prompts. `probability` and `energy` are what the
head serves; `centroid` (cosine to the nearest intent mean of train) and `knn5` (mean cosine to the 5
nearest in-scope train examples) are density scores the router does not serve, measured beside them.

Few-shot (build/clinc150.few.yaml, 10 utterances per intent): each scoring choice has its thresholds
tuned on one half of val (odd lines) and is scored on the other, then the other way round; the
figures are the mean of both. What plain `fit` chooses among (top_k) is there, and two alternatives
it does not offer: a head trained on the config's own utterances, and similarity after centring the
embeddings on the utterances' mean.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from esr_settings import replace_at  # noqa: E402
from esr_app.embedding import make_backend  # noqa: E402
from router.classifier import RouteClassifier  # noqa: E402
from esr_config import RouterConfig, load_config  # noqa: E402
from router.head import LinearHead, train_head  # noqa: E402
from esr_tuning.evaluation import load_labelled  # noqa: E402
from esr_tuning.fit import TOP_K_CANDIDATES, label_indices, objective_function, tune_thresholds  # noqa: E402


def auroc(in_scope: np.ndarray, out_scope: np.ndarray) -> float:
    """P(an in-scope prompt scores above an out-of-scope one), ties counted half."""
    scores = np.concatenate([out_scope, in_scope])
    # Ranks averaged over ties, so equal scores count half.
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    start = 0
    for end in range(1, len(scores) + 1):
        if end == len(scores) or sorted_scores[end] != sorted_scores[start]:
            ranks[order[start:end]] = (start + end - 1) / 2
            start = end
    n_in, n_out = len(in_scope), len(out_scope)
    return float((ranks[n_out:].sum() - n_in * (n_in - 1) / 2) / (n_in * n_out))


def separation(score: np.ndarray, is_out: np.ndarray) -> dict:
    keep95 = np.quantile(score[~is_out], 0.05)
    return {"auroc": round(auroc(score[~is_out], score[is_out]), 4),
            "oos_recall_at_95_in_scope": round(float((score[is_out] < keep95).mean()), 4)}


def full_recipe(config: RouterConfig, train_path: Path, val_path: Path) -> dict:
    encoder = make_backend(config)
    names = config.route_names
    train, val = load_labelled(train_path, names), load_labelled(val_path, names)
    default = config.default_route.name
    head = LinearHead.load(config.classifier.head_path)
    x_val = encoder.encode(val.texts)
    keep = [i for i, label in enumerate(train.labels) if label != default]
    x_train = encoder.encode([train.texts[i] for i in keep])
    intents = np.asarray([(train.intents or train.labels)[i] for i in keep])
    routes = sorted(set(head.routes))
    centroids = np.stack([x_train[intents == c].mean(axis=0) for c in sorted(set(intents))])
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
    sims = x_val @ x_train.T
    scores = {
        # What the router serves: the top route's score decides against its threshold.
        "probability (served)": head.route_scores(x_val, routes, "probability").max(axis=1),
        "energy (served)": head.route_scores(x_val, routes, "energy").max(axis=1),
        "centroid": (x_val @ centroids.T).max(axis=1),
        "knn5": -np.partition(-sims, 4, axis=1)[:, :5].mean(axis=1),
    }
    is_out = np.asarray(val.labels) == default
    return {"config": str(config.encoder.model), "val_in_scope": int((~is_out).sum()),
            "val_out_of_scope": int(is_out.sum()),
            "scores": {name: separation(s, is_out) for name, s in scores.items()}}


def _cross_fitted(classifier: RouteClassifier, scores: np.ndarray, truth: np.ndarray) -> dict:
    """Thresholds tuned on odd lines, scored on even ones, and the other way round: the mean."""
    halves = np.arange(0, len(truth), 2), np.arange(1, len(truth), 2)
    figures = []
    for tune, held in (halves, halves[::-1]):
        th = tune_thresholds(classifier, scores[tune], truth[tune])
        chosen = classifier.choose(scores[held], th)
        hit = chosen == truth[held]
        figures.append((hit[truth[held] >= 0].mean(), hit[truth[held] < 0].mean(),
                        objective_function(truth[held], "shifted")(chosen)))
    in_scope, default, shifted = np.mean(figures, axis=0)
    return {"in_scope": round(float(in_scope), 4), "oos_recall": round(float(default), 4),
            "at_20pct_oos": round(float(shifted), 4)}


def few_shot(config: RouterConfig, val_path: Path) -> dict:
    encoder = make_backend(config)
    val = load_labelled(val_path, config.route_names)
    texts = sorted({u for r in config.routes for u in r.utterances} | set(config.default_route.utterances) | set(val.texts))
    vectors = dict(zip(texts, encoder.encode(texts)))

    def encode(batch):
        return np.stack([vectors[t] for t in batch])

    x_val, truth = encode(val.texts), label_indices(config, val.labels)
    out = {}
    for k in TOP_K_CANDIDATES:
        cfg = replace_at(config, "classifier", top_k=k, aggregation="mean")
        clf = RouteClassifier(cfg, encode)
        out[f"similarity top_k={k}"] = _cross_fitted(clf, clf.scores(x_val), truth)
    anchors = encode([u for r in config.routes for u in r.utterances] + list(config.default_route.utterances))
    mean = anchors.mean(axis=0)

    def centred(batch):
        v = encode(batch) - mean
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    k5 = replace_at(config, "classifier", top_k=5, aggregation="mean")
    clf = RouteClassifier(k5, centred)
    out["similarity top_k=5, centred"] = _cross_fitted(clf, clf.scores(centred(val.texts)), truth)
    groups = [r.utterances for r in config.routes] + [config.default_route.utterances]
    labels = [name for name, g in zip(config.route_names, groups) for _ in g]
    head = train_head(encode([u for g in groups for u in g]), labels, config.route_names)
    for score in ("probability", "energy"):
        cfg = replace_at(config, "classifier", method="head", head_score=score)
        clf = RouteClassifier(cfg, encode, head=head)
        out[f"head on the utterances, {score}"] = _cross_fitted(clf, clf.scores(x_val), truth)
    return out


def table(result: dict) -> str:
    lines = ["full recipe: out-of-scope separation on val", f"{'score':<28}{'AUROC':>8}{'OOS recall @95% in':>22}"]
    for name, s in result["full_recipe"]["scores"].items():
        lines.append(f"{name:<28}{s['auroc']:>8.4f}{s['oos_recall_at_95_in_scope']:>22.3f}")
    lines += ["", "few-shot: val halves, tuned on one, scored on the other",
              f"{'scoring':<36}{'in-scope':>10}{'OOS recall':>12}{'at 20% OOS':>12}"]
    for name, s in result["few_shot"].items():
        lines.append(f"{name:<36}{s['in_scope']:>10.4f}{s['oos_recall']:>12.4f}{s['at_20pct_oos']:>12.4f}")
    return "\n".join(lines)


def main() -> None:
    data = ROOT.parent / "shared" / "data" / "clinc150"
    p = argparse.ArgumentParser()
    p.add_argument("--fitted", type=Path, default=ROOT / "build" / "clinc150.fitted.yaml", help="make clinc150's output")
    p.add_argument("--fewshot", type=Path, default=ROOT / "build" / "clinc150.few.yaml", help="make clinc150-fewshot's")
    p.add_argument("--train", type=Path, default=data / "train.jsonl")
    p.add_argument("--val", type=Path, default=data / "val.jsonl")
    p.add_argument("--out", type=Path, default=ROOT / "build" / "clinc150-study.json")
    args = p.parse_args()
    for path, target in ((args.fitted, "make clinc150"), (args.fewshot, "make clinc150-fewshot")):
        if not path.exists():
            sys.exit(f"{path} is missing: run `{target}` first")
    result = {"full_recipe": full_recipe(load_config(args.fitted), args.train, args.val),
              "few_shot": few_shot(load_config(args.fewshot), args.val)}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
