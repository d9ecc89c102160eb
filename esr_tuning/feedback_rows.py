"""Score rows from decision records: each score selection feedback took (a `"kind": "score"` record),
joined by its selection id to the record of the request it scored, whose newest text is the prompt.
What `select-fit --records` learns from beside a team's eval rows (docs/model-selection.md)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Sequence

from esr_tuning.score_matrix import ScoreRow


def feedback_rows(paths: Sequence[str | Path]) -> tuple[list[ScoreRow], Counter]:
    """One row per score whose request was recorded with its texts (records.prompts), in the order
    the scores were taken; and how many were not: `no_request` (its request's record is in none of
    `paths`: sampled out, or in an older file), `no_texts` (recorded without them), `repeated` (a
    second score for one request: the first counts). A line that is no record at all (cut short) is
    counted `malformed`."""
    prompts: dict[str, str | None] = {}  # selection id -> the request's newest text (None: not kept)
    scores: list[tuple[str, str, float]] = []  # (selection id, model, score)
    counts: Counter = Counter()
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    key = row.get("selection_id")
                    if not isinstance(key, str):
                        continue
                    if row.get("kind") == "score":
                        score = float(row["score"])
                        if not 0.0 <= score <= 1.0:
                            raise ValueError("score")
                        scores.append((key, str(row["model"]), score))
                    else:
                        texts = row.get("texts")
                        kept = isinstance(texts, list) and texts and isinstance(texts[-1], str) and texts[-1]
                        prompts[key] = kept or None
                except (ValueError, KeyError, TypeError, AttributeError):
                    counts["malformed"] += 1
    rows = []
    taken: set[str] = set()
    for key, model, score in scores:
        prompt = prompts.get(key)
        if key in taken:  # scored twice (two workers, each deciding alone): the first counts
            counts["repeated"] += 1
        elif key not in prompts:
            counts["no_request"] += 1
        elif prompt is None:
            counts["no_texts"] += 1
        else:
            taken.add(key)
            rows.append(ScoreRow(prompt, model, score))
    counts["joined"] = len(rows)
    return rows, counts
