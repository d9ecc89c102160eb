"""Adapts the encoder to a routes config's own examples: contrastive fine-tuning with
sentence-transformers' MultipleNegativesRankingLoss, saved as a local sentence-transformers model.

Each step takes two examples of each of `batch_size` different classes: the pair is pulled together
and every other class in the batch pushed away (in-batch negatives, none of them of the anchor's own
class). Default-route examples are not trained on: out-of-scope traffic is no class to pull together.
A plain loop over the library's loss: its Trainer would bring `datasets` and `accelerate` for
nothing this needs.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FinetuneSettings:
    epochs: float = 1.0  # passes over the examples (one step uses 2 x batch_size of them)
    batch_size: int = 64  # classes per step (capped at the number of classes)
    learning_rate: float = 2e-5
    seed: int = 0


def finetune(model_path: str, device: str, texts: Sequence[str], classes: Sequence[str], out_dir: Path,
             settings: FinetuneSettings = FinetuneSettings()) -> dict:
    """Trains from `model_path` on `texts` labelled with `classes` (fine labels are better: intents
    rather than routes) and saves to `out_dir`. Returns what it did, for the CLI to print."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import losses

    by_class: dict[str, list[str]] = {}
    for text, label in zip(texts, classes):
        by_class.setdefault(label, []).append(text)
    usable = sorted(c for c, examples in by_class.items() if len(examples) >= 2)
    if len(usable) < 2:
        raise ValueError("fine-tuning needs at least two classes with two examples each")
    batch = min(settings.batch_size, len(usable))
    steps = max(1, int(settings.epochs * sum(len(by_class[c]) for c in usable) / (2 * batch)))
    rng = random.Random(settings.seed)
    torch.manual_seed(settings.seed)

    model = SentenceTransformer(model_path, device=device)
    loss = losses.MultipleNegativesRankingLoss(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate)
    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(  # linear warm-up over a tenth, then linear decay
        optimizer, lambda s: (s + 1) / warmup if s < warmup else max(0.0, (steps - s) / max(1, steps - warmup)))
    model.train()
    started = time.monotonic()
    for step in range(steps):
        pairs = [rng.sample(by_class[c], 2) for c in rng.sample(usable, batch)]
        anchors = model.preprocess([a for a, _ in pairs])
        positives = model.preprocess([p for _, p in pairs])
        anchors, positives = ({k: v.to(model.device) if hasattr(v, "to") else v for k, v in f.items()}
                              for f in (anchors, positives))
        value = loss([anchors, positives], None)
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
        schedule.step()
        if step % 50 == 0 or step == steps - 1:
            log.info("fine-tuning", extra={"step": step + 1, "steps": steps, "loss": round(float(value.detach()), 4)})
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save(str(out_dir))
    return {"steps": steps, "classes": len(usable), "batch": batch, "seconds": round(time.monotonic() - started, 1),
            "device": str(model.device)}
