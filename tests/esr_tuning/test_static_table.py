"""The static tier's table trained on a head config's examples (esr_tuning/static_table.py), and the
trained rows laid over the bundled model's distilled table where they were trained from it."""

from __future__ import annotations

import numpy as np
import pytest

from esr_app.routing_build import static_embedding
from esr_model.static_embedding import save_trained
from esr_tuning.static_table import train_rows
from tests.support.fakes import config


def toy(seed: int = 0):
    """Two intents told apart by one of their four tokens; the other three, shared, dominate a
    text's mean in a random table, so only trained rows separate the intents' means."""
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((12, 8)).astype(np.float32)
    texts, labels = [], []
    for _ in range(200):
        label = int(rng.integers(2))
        texts.append([4 + label] + list(rng.choice([0, 1, 2, 3], size=3)))
        labels.append(["a", "b"][label])
    return table, texts, labels


def separable(table: np.ndarray, texts, labels) -> float:
    """Accuracy of the nearest class mean on unit text means: how well the table tells them apart."""
    means = np.stack([table[t].mean(axis=0) for t in texts])
    means /= np.linalg.norm(means, axis=1, keepdims=True)
    y = np.asarray([label == "b" for label in labels])
    centres = np.stack([means[~y].mean(axis=0), means[y].mean(axis=0)])
    return float(((means @ centres.T).argmax(axis=1) == y).mean())


def test_training_moves_only_the_rows_used_and_makes_the_intents_separable():
    table, texts, labels = toy()
    trained = train_rows(table, texts, labels, epochs=20)
    assert list(trained.rows) == [0, 1, 2, 3, 4, 5]  # tokens 6-11 never occur
    new = table.copy()
    new[trained.rows] = trained.vectors
    assert separable(new, texts, labels) >= separable(table, texts, labels) + 0.1  # measured: 0.88 against 0.74
    again = train_rows(table, texts, labels, epochs=20)
    assert np.array_equal(again.vectors, trained.vectors)  # the same seed, the same table: fit is reproducible


def test_trained_rows_are_laid_over_the_table_they_were_trained_from_and_refused_over_another(tmp_path):
    static = static_embedding(config(static_tier={"enabled": True}))
    token = static.token_ids("salary")
    rows = np.asarray(token, dtype=np.int64)
    vectors = np.ones((len(rows), static.dimension), dtype=np.float32)
    save_trained(tmp_path / "rows.npz", rows, vectors, static.source)
    trained = static_embedding(config(static_tier={"enabled": True, "table_path": str(tmp_path / "rows.npz")}))
    assert np.array_equal(trained.table[rows], vectors)
    assert np.array_equal(np.delete(trained.table, rows, axis=0), np.delete(static.table, rows, axis=0))
    assert not np.allclose(trained.encode(["salary"]), static.encode(["salary"]))
    save_trained(tmp_path / "other.npz", rows, vectors, static.source.replace("weights", "other weights"))
    with pytest.raises(ValueError, match="static_tier.table_path: .* trained over another encoder's static table"):
        static_embedding(config(static_tier={"enabled": True, "table_path": str(tmp_path / "other.npz")}))
    with pytest.raises(ValueError, match="static_tier.table_path: cannot read"):
        static_embedding(config(static_tier={"enabled": True, "table_path": str(tmp_path / "missing.npz")}))
