"""Quality data for model selection: how well each model answered each prompt.

A team brings its own eval rows as JSONL, one line per (prompt, model):

    {"prompt": "...", "model": "gpt-small", "score": 0.83, "cost": 0.0004}

`prompt` may be `messages` instead (an OpenAI-style list: the routed text is taken as the server
takes it); `score` is in [0, 1] (a grader's verdict, a pass/fail as 0/1, a judge's scale divided
out); `cost` is optional (per request, any unit; the config's prices are used where it is absent).
RouterBench's columns map onto it: its `prompt` is `prompt`, each model column's value is one row's
`score`, and its `<model>|total_cost` column is that row's `cost`.

`synthetic` makes such rows for tests and benches where a team's are not at hand: seeded, over
labelled prompts (CLINC150's domains and intents), with models of 1-50x price, each good at some
domains and weak at others (per-domain competence) and prompts of varying difficulty (an intent's
share, which the prompt's text shows, and the prompt's own, which it does not).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from esr_tuning.jsonl import BadRecord, read_records
from router.llm_body import content_text


@dataclass(frozen=True)
class ScoreRow:
    prompt: str
    model: str
    score: float
    cost: float | None = None


@dataclass(frozen=True)
class ScoreMatrix:
    """Prompts x models: every model's score on every prompt (rows missing a pair are dropped), or
    NaN where a model was not scored on a prompt (with_observed)."""

    prompts: list[str]
    models: list[str]
    scores: np.ndarray  # (prompts, models)
    costs: np.ndarray  # (models,): mean cost per request

    def subset(self, index: np.ndarray) -> "ScoreMatrix":
        return ScoreMatrix([self.prompts[i] for i in index], self.models, self.scores[index], self.costs)


def read_rows(path: str | Path) -> list[ScoreRow]:
    def parse(row: dict) -> ScoreRow:
        prompt = row.get("prompt")
        if prompt is None:  # the last user message's text, as the server reads content (parts too)
            users = [content_text(m.get("content")) for m in row["messages"] if m.get("role") == "user"]
            prompt = users[-1] if users else None
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("no prompt")
        score = float(row["score"])
        if not 0.0 <= score <= 1.0:
            raise BadRecord(f"score {score} is not in [0, 1]")
        cost = row.get("cost")
        if cost is not None and not float(cost) > 0:
            raise BadRecord(f"cost {cost} is not positive (a free model: give it a small price)")
        return ScoreRow(prompt, str(row["model"]), score, None if cost is None else float(cost))

    return read_records(path, parse, '{"prompt": ..., "model": ..., "score": 0..1, "cost"?: ...}', "score rows")


def matrix(rows: Sequence[ScoreRow], prices: dict[str, float] | None = None) -> ScoreMatrix:
    """The rows as a matrix: prompts every model was scored on, in first-seen order; a model's cost
    is the mean of its rows' costs, else its price in `prices`, else 1."""
    models = list(dict.fromkeys(r.model for r in rows))
    by_prompt: dict[str, dict[str, float]] = {}
    spent: dict[str, list[float]] = {m: [] for m in models}
    for r in rows:
        by_prompt.setdefault(r.prompt, {})[r.model] = r.score
        if r.cost is not None:
            spent[r.model].append(r.cost)
    prompts = [p for p, got in by_prompt.items() if len(got) == len(models)]
    scores = np.asarray([[by_prompt[p][m] for m in models] for p in prompts], dtype=np.float64)
    costs = np.asarray([np.mean(spent[m]) if spent[m] else (prices or {}).get(m, 1.0) for m in models])
    return ScoreMatrix(prompts, models, scores, costs)


def with_observed(base: ScoreMatrix, rows: Sequence[ScoreRow]) -> ScoreMatrix:
    """`base` and a row of its own for each of `rows` (a prompt scored on one model: selection
    feedback), the other models' scores unknown (NaN); a model only `rows` name is added, unknown
    on `base`'s prompts. Costs stay `base`'s (1 for an added model: a config's price overrides it)."""
    models = base.models + [m for m in dict.fromkeys(r.model for r in rows) if m not in base.models]
    scores = np.full((len(base.prompts) + len(rows), len(models)), np.nan)
    scores[: len(base.prompts), : len(base.models)] = base.scores
    for i, r in enumerate(rows, len(base.prompts)):
        scores[i, models.index(r.model)] = r.score
    costs = np.concatenate([base.costs, np.ones(len(models) - len(base.models))])
    return ScoreMatrix(base.prompts + [r.prompt for r in rows], models, scores, costs)


# Price per request relative to the cheapest; how good each is overall; how far its competence
# swings between domains (small models are specialists, the largest good at everything).
SYNTHETIC_MODELS = {"nano": (1.0, -1.2, 1.1), "small": (3.0, -0.5, 0.9), "medium": (8.0, 0.2, 0.6),
                    "large": (20.0, 0.8, 0.4), "frontier": (50.0, 1.3, 0.25)}


def synthetic(texts: Sequence[str], domains: Sequence[str], intents: Sequence[str], seed: int = 0,
              models: dict[str, tuple[float, float, float]] = SYNTHETIC_MODELS) -> list[ScoreRow]:
    """One row per (prompt, model). A model's competence on a domain is its level plus a seeded
    swing; a prompt's difficulty is its intent's (seen in the text) plus its own (not seen); the
    score is how far competence exceeds difficulty, through a logistic, with a little grading noise."""
    rng = np.random.default_rng(seed)
    names = list(models)
    domain_ids = {d: i for i, d in enumerate(sorted(set(domains)))}
    intent_ids = {t: i for i, t in enumerate(sorted(set(intents)))}
    competence = np.stack([level + swing * rng.standard_normal(len(domain_ids))
                           for _, level, swing in models.values()])  # (models, domains)
    intent_difficulty = 0.8 * rng.standard_normal(len(intent_ids))
    own = 0.5 * rng.standard_normal(len(texts))
    rows = []
    for i, (text, domain, intent) in enumerate(zip(texts, domains, intents)):
        difficulty = intent_difficulty[intent_ids[intent]] + own[i]
        gap = competence[:, domain_ids[domain]] - difficulty
        scores = np.clip(1.0 / (1.0 + np.exp(-1.8 * gap)) + 0.04 * rng.standard_normal(len(names)), 0.0, 1.0)
        rows += [ScoreRow(text, m, round(float(s), 4), models[m][0]) for m, s in zip(names, scores)]
    return rows


def write_rows(rows: Sequence[ScoreRow], path: str | Path) -> None:
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps({"prompt": r.prompt, "model": r.model, "score": r.score, "cost": r.cost}) + "\n")
