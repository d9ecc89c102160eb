"""A small classifier trained on prompt embeddings (torch), saved as .npz: linear, or linear over one
hidden ReLU layer (the static tier's head where fit learns from recorded traffic)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

import numpy as np


# How a head with a hidden layer trains: shuffled steps rather than full-batch epochs, which took
# most of a nightly refit's time for the same held-out agreement (docs/notes/benchmarks-history.md).
HIDDEN_EPOCHS = 40
HIDDEN_BATCH = 512


@dataclass(frozen=True)
class LinearHead:
    """Classes may be finer than routes (intents, say): `routes[i]` is the route of class i.
    Finer classes give a sharper confidence, which is what out-of-scope detection needs."""

    classes: tuple[str, ...]
    routes: tuple[str, ...]
    weight: np.ndarray  # (classes, dim)
    bias: np.ndarray  # (classes,)
    # (classes, dim): the unit mean of each class's training embeddings, where fit kept them: how
    # near a new embedding lies to anything the head was taught (the static tier's in-scope check).
    prototypes: np.ndarray | None = None
    # (hidden, dim), (hidden,): a ReLU layer the linear layer reads instead of the embedding; None: none.
    hidden_weight: np.ndarray | None = None
    hidden_bias: np.ndarray | None = None

    def route_scores(self, embeddings: np.ndarray, route_names: list[str],
                     score: Literal["probability", "energy"] = "probability") -> np.ndarray:
        """(n, routes): each route's best class probability, or (energy) the head's energy, the
        log-sum-exp of all logits, less how far the route's best logit trails the top one."""
        return self.grouped(route_names).route_scores(self.logits(embeddings), score)

    def grouped(self, route_names: Sequence[str]) -> "RouteGroups":
        return RouteGroups(self.routes, route_names)

    @property
    def dimension(self) -> int:
        """The embedding width it reads."""
        return int((self.hidden_weight if self.hidden_weight is not None else self.weight).shape[1])

    def logits(self, embeddings: np.ndarray) -> np.ndarray:
        if self.hidden_weight is not None:
            embeddings = np.maximum(embeddings @ self.hidden_weight.T + self.hidden_bias, 0.0)
        return embeddings @ self.weight.T + self.bias

    def save(self, path: str | Path) -> None:
        arrays = {"classes": np.asarray(self.classes), "routes": np.asarray(self.routes), "weight": self.weight,
                  "bias": self.bias}
        for name in ("prototypes", "hidden_weight", "hidden_bias"):
            if getattr(self, name) is not None:
                arrays[name] = getattr(self, name)
        np.savez(path, **arrays)  # type: ignore[arg-type]

    @classmethod
    def load(cls, path: str | Path) -> "LinearHead":
        with np.load(path, allow_pickle=False) as data:
            def optional(name: str) -> np.ndarray | None:
                return data[name].astype(np.float32) if name in data.files else None

            return cls(tuple(str(c) for c in data["classes"]), tuple(str(r) for r in data["routes"]),
                       data["weight"].astype(np.float32), data["bias"].astype(np.float32), optional("prototypes"),
                       optional("hidden_weight"), optional("hidden_bias"))

    def with_prototypes(self, embeddings: np.ndarray, labels: Sequence[str]) -> "LinearHead":
        """This head with its classes' prototypes taken from `embeddings` (unit rows, one class
        label each, every class present)."""
        named = np.asarray(labels)
        means = np.stack([embeddings[named == c].mean(axis=0) for c in self.classes])
        return dataclasses.replace(self, prototypes=(means / np.linalg.norm(means, axis=1, keepdims=True))
                                   .astype(np.float32))


class RouteGroups:
    """The head's classes grouped by route, once: a route's best logit is then one reduceat, not a
    scan of the classes per route (a request's scoring would otherwise cost ~100 us of Python)."""

    def __init__(self, class_routes: Sequence[str], route_names: Sequence[str]):
        by_route = [[i for i, r in enumerate(class_routes) if r == name] for name in route_names]
        self.has_class = np.asarray([bool(cols) for cols in by_route])
        # A route with no class (reached only by keywords or rules) scores -inf: never chosen.
        self.order = np.asarray([i for cols in by_route for i in cols], dtype=np.int64)
        self.starts = np.cumsum([0] + [len(cols) for cols in by_route if cols])[:-1]
        self.every_route = bool(len(self.order)) and bool(self.has_class.all())

    def route_scores(self, logits: np.ndarray, score: Literal["probability", "energy"]) -> np.ndarray:
        top = logits.max(axis=-1, keepdims=True)
        log_norm = np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))
        if self.every_route:  # the usual head: no column of -inf to leave
            best = np.maximum.reduceat(logits[:, self.order], self.starts, axis=1)
        else:
            best = np.full((len(logits), len(self.has_class)), -np.inf, dtype=logits.dtype)
            if len(self.order):
                best[:, self.has_class] = np.maximum.reduceat(logits[:, self.order], self.starts, axis=1)
        if score == "energy":
            return (top + log_norm) - (top - best)
        return np.exp(best - top - log_norm)


def train_head(
    embeddings: np.ndarray,
    labels: Sequence[str],
    classes: Sequence[str],
    routes: Sequence[str] | None = None,
    epochs: int = 300,
    lr: float = 0.05,
    weight_decay: float = 1e-4,
    seed: int = 0,
    hidden: int = 0,
    soft: np.ndarray | None = None,
    batch: int | None = None,
) -> LinearHead:
    """Multinomial logistic regression over `classes` (route of each: `routes`, default the
    class itself); classes are weighted so a rare one is not ignored. `hidden`: that many ReLU
    units first (0: none). `soft`: (n, classes) target distributions learnt instead of the labels
    (a teacher's, for distillation), the labels still weighting the classes. `batch`: each epoch
    in shuffled steps of that many examples (None: one step of all of them)."""
    import torch

    index = {c: i for i, c in enumerate(classes)}
    y = torch.tensor([index[label] for label in labels])
    x = torch.from_numpy(np.ascontiguousarray(embeddings, dtype=np.float32))
    counts = torch.bincount(y, minlength=len(classes)).float().clamp(min=1)
    class_weight = counts.sum() / (len(classes) * counts)
    gen = torch.Generator().manual_seed(seed)
    first = torch.nn.Linear(x.shape[1], hidden) if hidden else None
    layer = torch.nn.Linear(hidden or x.shape[1], len(classes))
    with torch.no_grad():
        for lin in (first, layer):
            if lin is not None:
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen) * (lin.in_features ** -0.5 if hidden else 0.01))
                lin.bias.zero_()
    params = list(layer.parameters()) + (list(first.parameters()) if first is not None else [])
    # A hidden layer learns at a fifth of a linear head's rate (0.05 overshoots it).
    opt = _Adam(params, lr=lr / 5 if hidden else lr, weight_decay=weight_decay)
    target = torch.from_numpy(np.ascontiguousarray(soft, dtype=np.float32)) if soft is not None else None

    def loss_of(rows):
        logits = layer(torch.relu(first(x[rows])) if first is not None else x[rows])
        if target is None:
            return torch.nn.functional.cross_entropy(logits, y[rows], weight=class_weight)
        return -(class_weight[y[rows]] * (target[rows] * torch.log_softmax(logits, dim=1)).sum(dim=1)).mean()

    every = slice(None)
    for _ in range(epochs):
        order = [every] if batch is None else torch.randperm(len(x), generator=gen).split(batch)
        for rows in order:
            opt.zero_grad()
            loss_of(rows).backward()
            opt.step()

    def numpy(t) -> np.ndarray:
        return t.detach().numpy().copy()

    return LinearHead(tuple(classes), tuple(routes or classes), numpy(layer.weight), numpy(layer.bias),
                      hidden_weight=numpy(first.weight) if first is not None else None,
                      hidden_bias=numpy(first.bias) if first is not None else None)


class _Adam:
    """torch.optim.Adam's update on the CPU (its single-tensor path, L2 weight decay added to the
    gradient), op for op, so a head trains to the same bits, without torch.optim: importing it
    pulls in torch._dynamo, seconds of every fit."""

    def __init__(self, params, lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8):
        import torch

        self.params = list(params)
        self.moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in self.params]
        self.lr, self.weight_decay, self.betas, self.eps = lr, weight_decay, betas, eps
        self.steps = 0

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        import torch

        self.steps += 1
        beta1, beta2 = self.betas
        step_size = self.lr / (1 - beta1 ** self.steps)
        correction2_sqrt = (1 - beta2 ** self.steps) ** 0.5
        with torch.no_grad():
            for p, (mean, square) in zip(self.params, self.moments):
                grad = p.grad if self.weight_decay == 0 else p.grad.add(p, alpha=self.weight_decay)
                mean.lerp_(grad, 1 - beta1)
                square.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                p.addcdiv_(mean, (square.sqrt() / correction2_sqrt).add_(self.eps), value=-step_size)


class HeadScorer:
    """Route scores from a trained head: probabilities or energies (see ClassifierConfig.head_score)."""

    def __init__(self, head: LinearHead, route_names: Sequence[str],
                 score: Literal["probability", "energy"] = "probability", required: Sequence[str] | None = None):
        """`required`: the routes the head must have classes for (default: all); others score -inf."""
        missing = set(route_names if required is None else required) - set(head.routes)
        if set(head.routes) - set(route_names) or missing:
            raise ValueError(
                f"classifier.head_path: head routes {sorted(set(head.routes))} do not match {sorted(route_names)}"
            )
        self.head = head
        self._groups = head.grouped(route_names)
        self._score = score

    def scores(self, embeddings: np.ndarray) -> np.ndarray:
        return self._groups.route_scores(self.head.logits(embeddings), self._score)
