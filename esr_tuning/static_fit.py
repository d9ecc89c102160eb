"""Fits the cascade's first tier (router/static_tier.py) to a config the encoder already routes:
its head (a head config's) on the encoder head's training split, then its thresholds and, per route,
the margin at which its decision stands, chosen on held-out examples so that the decisions it keeps
agree with the encoder's (so the cascade's accuracy stays within about `max_disagreement` of the
encoder's), and for a head, how near a prompt must lie to what the head was taught (with_in_scope_check).
A similarity config's utterances are held out a fold at a time.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from esr_config import RouterConfig
from router.classifier import RouteClassifier
from router.head import LinearHead
from router.conversation import deciding_turn
from router.static_tier import margins, own_turn_lead, prototype_similarity, route_accepts, static_classifier
from esr_tuning.each_text_once import EachTextOnce
from esr_tuning.evaluation import SHIFTED_DEFAULT_SHARE
from esr_tuning.fit import head_split, label_indices, train_split_head, tune_thresholds
from esr_tuning.static_table import StaticTable, TrainedRows, train_over

# At most this share of the decisions the static tier keeps for a route may differ from the encoder's.
MAX_DISAGREEMENT = 0.004
# A margin stands only on this many held-out decisions at or above it: fewer say nothing.
MIN_SUPPORT = 20
# The in-scope check (with_in_scope_check) lets this share of held-out in-scope static decisions stand.
# CLINC150 val, the recipe: 0.98 let 5 of its 100 out-of-scope prompts be decided statically instead of 8,
# for 2.2 points of static share; with 20% out-of-scope traffic, accuracy -0.0033 against the encoder's instead of -0.0079.
IN_SCOPE_KEEP = 0.98
NEVER = math.inf  # a route's accept margin when no margin was safe: the encoder decides all of its prompts
FOLDS = 5


@dataclass
class StaticFit:
    config: RouterConfig
    head: LinearHead | None
    notes: list[str]
    table: TrainedRows | None = None  # rows trained over the distilled table (a head config's)
    embedding: StaticTable | None = None  # what the tier serves with (the rows laid over); None: the one fit was given


def cleared(config: RouterConfig) -> RouterConfig:
    """`config` with no static tier fitted yet."""
    return dataclasses.replace(config, static_tier=dataclasses.replace(
        config.static_tier, thresholds={}, accept={}, head_path=None, table_path=None, min_similarity=None))


@dataclass(frozen=True)
class WholeRequests:
    """Requests of several turns as recorded (each its routed texts, oldest first) that the encoder
    routed by their context, with its route: margin examples as serving meets them. The static tier
    decides on the newest turn, which reads like a topic of its own in many a follow-up; margins set
    on single turns alone let it decide those against the encoder (records_fit's teaching)."""
    texts: Sequence[tuple[str, ...]]
    routes: Sequence[str]

    def examples(self, config: RouterConfig, encode, head: LinearHead | None) -> tuple[np.ndarray, ...]:
        """(static choices, their leads, the encoder's choices), each request weighed as StaticTier
        weighs it under `config`'s thresholds (own_turn_lead)."""
        classifier = static_classifier(config, encode, head)
        names = [r.name for r in config.routes]
        choices, lead = [], []
        for routed in self.texts:
            choice, ahead = own_turn_lead(classifier, classifier.scores(encode(list(routed))), config.conversation.gate)
            choices.append(choice)
            lead.append(ahead)
        agree = [names.index(route) if route in names else -1 for route in self.routes]
        return np.asarray(choices, dtype=np.int64), np.asarray(lead, dtype=np.float64), np.asarray(agree, dtype=np.int64)


# (config with the tuned thresholds) -> (choices, leads, the encoder's choices) of more margin examples
MoreExamples = Callable[[RouterConfig], tuple[np.ndarray, ...]]


def fit_head_tier(config: RouterConfig, encoder: RouteClassifier, embeddings: np.ndarray, texts: list[str],
                  labels: list[str], intents: list[str] | None, static: StaticTable, holdout: float = 0.2,
                  seed: int = 0, hidden: int = 0, teacher: np.ndarray | None = None, train_rows: bool = True,
                  overall: float | None = None, requests: WholeRequests | None = None) -> StaticFit:
    """A head config's tier: the static table's rows trained on fit's split (esr_tuning/static_table.py),
    a static head trained on the same split (`train_split_head`: `hidden` units, the `teacher`'s route
    distribution), its margins set on the held-out rest against `encoder`'s choices. `texts`: as
    routed; `static`: the distilled table's encoder; `train_rows`: False keeps the table as distilled;
    `overall`: the margins' budget (fit_margins, a kept decision weighed by the `teacher` where there is one);
    `requests`: whole requests the margins also hold on (none of them trains the head)."""
    base = cleared(config)
    fine = intents or labels
    train_idx, _ = head_split(base, labels, intents, holdout, seed)
    table = None
    if train_rows:
        table, static = train_over(static, [texts[i] for i in train_idx], [fine[i] for i in train_idx], seed)
    static_vectors = static.encode(texts)
    head, train, held = train_split_head(base, static_vectors, labels, intents, holdout, seed, hidden, teacher)
    classifier = static_classifier(base, static.encode, head)
    truth = label_indices(base, labels)[held]
    whole = None if requests is None else (lambda tuned: requests.examples(tuned, static.encode, head))
    fitted, notes = fit_margins(base, classifier, classifier.scores(static_vectors[held]),
                                encoder.choose(encoder.scores(embeddings[held])), truth, overall=overall,
                                teacher=teacher[held] if teacher is not None else None, more=whole)
    head = head.with_prototypes(static_vectors[train], [(intents or labels)[i] for i in train])
    fitted, more = with_in_scope_check(fitted, static_classifier(fitted, static.encode, head), static_vectors[held],
                                       truth)
    if table is not None:
        notes.append(f"static tier: {len(table.rows)} rows of its table trained on {len(train_idx)} examples")
    # Not retrained on the held-out part (table or head): see fit_conversation_tier.
    return StaticFit(fitted, head, notes + more, table, static)


def with_in_scope_check(config: RouterConfig, classifier: RouteClassifier, vectors: np.ndarray, truth: np.ndarray
                        ) -> tuple[RouterConfig, list[str]]:
    """`config` with static_tier.min_similarity: the similarity to the head's nearest class prototype
    that IN_SCOPE_KEEP of the held-out in-scope decisions the margins keep reach. Set without any
    out-of-scope example: fit's few of them say little of the ones traffic brings (CLINC150: the
    margins kept none of train's 100, and 8 of val's 100)."""
    head = classifier.head
    assert head is not None and head.prototypes is not None  # fit_head_tier's head, its prototypes taken
    scores = classifier.scores(vectors)
    choices = classifier.choose(scores)
    accept = route_accepts(config)
    kept = (choices >= 0) & (margins(classifier, scores, choices) >= accept[np.maximum(choices, 0)])
    near = prototype_similarity(head.prototypes, vectors)
    sure = kept & (truth >= 0)
    if sure.sum() < MIN_SUPPORT:
        return config, []
    cut = math.floor(float(np.quantile(near[sure], 1 - IN_SCOPE_KEEP)) * 1e4) / 1e4
    outside = truth < 0
    still = kept & (near >= cut)
    note = (f"static tier: in-scope check at similarity {cut} (min_similarity) keeps "
            f"{float((still & sure).sum() / sure.sum()):.1%} of its held-out in-scope decisions")
    if outside.any():
        note += f", {int((still & outside).sum())} of {int(outside.sum())} out-of-scope (were {int((kept & outside).sum())})"
    return dataclasses.replace(config, static_tier=dataclasses.replace(config.static_tier, min_similarity=cut)), [note]


def fit_similarity_tier(config: RouterConfig, encode, static_encode, texts: list[str], overall: float | None = None,
                        requests: WholeRequests | None = None) -> StaticFit:
    """A similarity config's tier: each fold of the utterances scored by both tiers built on the
    other folds, and `texts` (traffic of any label, unlabelled will do) by both on all of them;
    `requests`: whole requests its margins also hold on."""
    base = cleared(config)
    static_scores, choices = [], []

    def score(cfg: RouterConfig, batch: list[str]) -> None:
        if batch:
            encoder = RouteClassifier(cfg, encode)
            static_scores.append(static_classifier(cfg, static_encode).scores(static_encode(batch)))
            choices.append(encoder.choose(encoder.scores(encode(batch))))

    for fold in range(FOLDS):
        routes = tuple(dataclasses.replace(r, utterances=tuple(u for i, u in enumerate(r.utterances) if i % FOLDS != fold))
                       for r in base.routes)
        if all(r.utterances for r in routes if any(o.utterances for o in base.routes if o.name == r.name)):
            score(dataclasses.replace(base, routes=routes),
                  [u for r in base.routes for i, u in enumerate(r.utterances) if i % FOLDS == fold])
    score(base, list(texts))
    whole = None if requests is None else (lambda tuned: requests.examples(tuned, static_encode, None))
    fitted, notes = fit_margins(base, static_classifier(base, static_encode),
                                np.concatenate(static_scores), np.concatenate(choices), overall=overall, more=whole)
    return StaticFit(fitted, None, notes)


# The per-route rates fit_margins tries where it is given an overall budget instead (fit --from-records).
RATES = (0.004, 0.006, 0.008, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1)


def fit_margins(config: RouterConfig, classifier: RouteClassifier, scores: np.ndarray, agree_with: np.ndarray,
                truth: np.ndarray | None = None, max_disagreement: float = MAX_DISAGREEMENT,
                overall: float | None = None, teacher: np.ndarray | None = None, more: MoreExamples | None = None
                ) -> tuple[RouterConfig, list[str]]:
    """The tier's thresholds (with_thresholds), then each route's accept margin (accept_margins)
    on the same held-out examples, each a request of one text, and `more` (whole requests, weighed
    under the tuned thresholds: WholeRequests; for them the encoder's choice stands for `truth`).
    `overall`: instead of one rate per route, the highest of RATES at which the decisions it keeps
    are expected to lose at most that share of all the held-out requests' accuracy (disagreements,
    or as `teacher` weighs them: _accepted)."""
    tuned = with_thresholds(config, classifier, scores, agree_with)
    thresholds = np.asarray([tuned.static_tier.thresholds[r.name] for r in config.routes], dtype=np.float32)
    choices = classifier.choose(scores, thresholds)
    lead = margins(classifier, scores, choices, thresholds)
    if more is not None:
        extra_choices, extra_lead, extra_agree = more(tuned)
        choices, lead = np.concatenate([choices, extra_choices]), np.concatenate([lead, extra_lead])
        agree_with = np.concatenate([agree_with, extra_agree])
        if truth is not None:
            truth = np.concatenate([truth, extra_agree])
        if teacher is not None:  # the encoder's own choice, certain (its default route: no column, cost 1)
            sure = np.zeros((len(extra_agree), teacher.shape[1]), dtype=teacher.dtype)
            sure[np.flatnonzero(extra_agree >= 0), extra_agree[extra_agree >= 0]] = 1.0
            teacher = np.concatenate([teacher, sure])
    if overall is None:
        fitted, notes, _ = _accepted(tuned, choices, lead, agree_with, truth, max_disagreement, teacher)
        return fitted, notes
    chosen = (dataclasses.replace(tuned, static_tier=dataclasses.replace(
        tuned.static_tier, accept={r.name: NEVER for r in config.routes})),
        [f"static tier: no rate keeps its decisions within {overall:.2%} of all: the encoder decides every prompt"])
    for rate in RATES:
        fitted, notes, lost = _accepted(tuned, choices, lead, agree_with, truth, rate, teacher)
        if lost <= overall:
            chosen = (fitted, notes + [f"static tier: {rate:.2%} of a route's kept decisions may differ from the "
                                       f"encoder's, the most within {overall:.2%} of all"])
    return chosen


def with_thresholds(config: RouterConfig, classifier: RouteClassifier, scores: np.ndarray,
                    agree_with: np.ndarray) -> RouterConfig:
    """`config` with the static tier's route thresholds tuned on `scores` (the static tier's) to
    choose as the encoder chose (`agree_with`)."""
    thresholds = tune_thresholds(classifier, scores, agree_with, objective="accuracy")
    return dataclasses.replace(config, static_tier=dataclasses.replace(config.static_tier, thresholds={
        r.name: round(float(t), 4) for r, t in zip(config.routes, thresholds)}))


def accept_margins(config: RouterConfig, choices: np.ndarray, lead: np.ndarray, agree_with: np.ndarray,
                   truth: np.ndarray | None = None, max_disagreement: float = MAX_DISAGREEMENT
                   ) -> tuple[RouterConfig, list[str]]:
    """Each route's accept margin (_accept_level) from held-out requests: the static tier's choice
    and its lead, the encoder's choice. With `truth` (route indices), what a kept decision costs is
    accuracy, not agreement: a static mistake where the encoder is right costs 1, a static hit
    where the encoder is wrong gains 1."""
    fitted, notes, _ = _accepted(config, choices, lead, agree_with, truth, max_disagreement)
    return fitted, notes


def _accepted(config: RouterConfig, choices: np.ndarray, lead: np.ndarray, agree_with: np.ndarray,
              truth: np.ndarray | None, max_disagreement: float, teacher: np.ndarray | None = None
              ) -> tuple[RouterConfig, list[str], float]:
    """accept_margins, and the accuracy the decisions kept are expected to lose, as a share of all
    the requests. `teacher`: (n, routes) the encoder's probability of each route, where no label
    says which is right: a kept decision that differs from the encoder's then costs what the
    encoder's choice is more likely than the static tier's (1 where the encoder chose the default
    route, which it gives no probability), not 1."""
    names = [r.name for r in config.routes]
    accept, kept = {}, np.zeros(len(choices), dtype=bool)
    weight = np.ones(len(choices)) if truth is None else _shifted_weights(truth)
    costs = np.zeros(len(choices))
    for index, name in enumerate(names):  # the default route is the encoder's (router/static_tier.py)
        mine = np.flatnonzero(choices == index)
        if teacher is not None:
            theirs = agree_with[mine]
            likelier = teacher[mine, np.maximum(theirs, 0)] - teacher[mine, index]
            cost = weight[mine] * np.where(theirs == index, 0.0, np.where(theirs < 0, 1.0, np.maximum(likelier, 0.0)))
        elif truth is None:
            cost = (choices[mine] != agree_with[mine]).astype(np.float64)
        else:
            cost = weight[mine] * ((choices[mine] != truth[mine]).astype(np.float64)
                                   - (agree_with[mine] != truth[mine]).astype(np.float64))
        costs[mine] = cost
        level = _accept_level(lead[mine], cost, max_disagreement)
        accept[name] = max(0.0, math.ceil(level * 1e4) / 1e4) if math.isfinite(level) else NEVER
        kept[mine[lead[mine] >= level]] = True
    loss = float(costs[kept].sum() / len(kept)) if len(kept) else 0.0
    share = float(kept.mean()) if len(kept) else 0.0
    differ = float((kept & (choices != agree_with)).mean()) if len(kept) else 0.0
    lost = "" if truth is None else (
        f", accuracy {float((np.where(kept, choices, agree_with) == truth).mean()):.4f} against the encoder's "
        f"{float((agree_with == truth).mean()):.4f}")
    notes = [f"static tier: decides {share:.1%} of {len(choices)} held-out requests, differing from the encoder "
             f"on {differ:.2%} of them all{lost} (margins per route: {_shown(accept)})"]
    return dataclasses.replace(config, static_tier=dataclasses.replace(config.static_tier, accept=accept)), notes, loss


def fit_conversation_tier(config: RouterConfig, encoder: RouteClassifier, static: StaticTable, dialogues,
                          vectors: dict, holdout: float = 0.2, seed: int = 0) -> StaticFit:
    """On conversations: the table's rows (from `static`, the distilled table) and then the static
    head learn every user turn of most dialogues, and its margins
    are set on the requests of the rest, each decided as the server decides a conversation (the
    deciding turn's choice and lead, router/static_tier.py) against the encoder's decision for the
    same request. Margins set on single turns would not hold: a short follow-up both tiers get
    wrong alone costs nothing there, while the encoder gets it right from context."""
    from esr_tuning.conversations import split_dialogues

    base = cleared(config)
    gate = config.conversation.gate
    train, tune = split_dialogues(dialogues, holdout, seed)

    def turns(ds) -> tuple[list[str], list[str]]:
        return [texts[-1] for d in ds for texts in d.routed(config)], [label for d in ds for label in d.labels]

    train_texts, train_labels = turns(train)
    head, table = None, None
    if config.classifier.method == "head":
        table, static = train_over(static, train_texts, train_labels, seed)
    embed = EachTextOnce(static).encode

    if config.classifier.method == "head":
        head, _, _ = train_split_head(base, embed(train_texts), train_labels, None, 0.0, seed)
    classifier = static_classifier(base, embed, head)
    texts = turns(tune)[0]
    tuned = with_thresholds(base, classifier, classifier.scores(embed(texts)),
                            encoder.choose(encoder.scores(np.stack([vectors[t] for t in texts]))))
    classifier = static_classifier(tuned, embed, head)
    choices, lead, agree_with = [], [], []
    for d in tune:
        for routed in d.routed(config):
            choice, ahead = own_turn_lead(classifier, classifier.scores(embed(list(routed))), gate)
            choices.append(choice)
            lead.append(ahead)
            agree_with.append(deciding_turn(encoder, encoder.scores(np.stack([vectors[t] for t in routed])), gate)[1])
    # Judged on agreement, not accuracy: a conversation's turns carry their dialogue's label ("Yes."
    # under any domain), so accuracy forgives a static decision the encoder also gets wrong there,
    # which did not hold on SGD dev (cascade 0.9189 against the encoder's 0.9312).
    fitted, notes = accept_margins(tuned, np.asarray(choices), np.asarray(lead), np.asarray(agree_with))
    # The head keeps the margins' held-out dialogues unseen: retrained on them too, it would be surer
    # of exactly the turns the margins were measured on, and the margins would no longer be its own.
    return StaticFit(fitted, head, notes, table, static)


def _shifted_weights(truth: np.ndarray) -> np.ndarray:
    """Per example, so that the default route's examples weigh SHIFTED_DEFAULT_SHARE of the whole (as
    fit's shifted objective): a labelled set holds few of them, and a static decision for a route
    on a prompt that belongs nowhere is the cascade's costliest mistake once such traffic grows."""
    outside = truth < 0
    if not outside.any() or outside.all():
        return np.ones(len(truth))
    return np.where(outside, SHIFTED_DEFAULT_SHARE / outside.mean(), (1 - SHIFTED_DEFAULT_SHARE) / (~outside).mean())


def _accept_level(lead: np.ndarray, cost: np.ndarray, max_disagreement: float) -> float:
    """The lowest margin at which the decisions at or above it cost (disagreements, or accuracy:
    fit_margins) at most `max_disagreement` of them, over at least MIN_SUPPORT; inf where none does."""
    order = np.argsort(-lead, kind="stable")
    lead, wrong = lead[order], np.cumsum(cost[order])
    count = np.arange(1, len(lead) + 1)
    ok = (wrong <= max_disagreement * count) & (count >= MIN_SUPPORT)
    # Only where the next example's margin differs: a margin keeps every example that reaches it.
    ok &= np.append(lead[1:] < lead[:-1], True)
    hits = np.flatnonzero(ok)
    return float(lead[hits[-1]]) if hits.size else math.inf


def _shown(accept: dict) -> str:
    return ", ".join(f"{k} {'never' if not math.isfinite(v) else round(v, 3)}" for k, v in accept.items())
