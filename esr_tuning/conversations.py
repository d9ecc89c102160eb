"""Routing quality turn by turn on labelled conversations, and the conversation gate fitted on them.

Data: JSONL lines {"messages": [{"role": "user"|"assistant"|"system"|..., "content": ...}, ...], "labels":
[one route per user message, in order]} (the format of ../shared/data/sgd). User turn t is routed as a
gateway sees the request that ends with it: the texts come from router.llm_body.texts_to_route
(the server's own code) under the config's `conversation` and `requests` settings, system prompt
included, and the decision from router.conversation.deciding_turn, as RoutingEngine.decide makes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from esr_settings import replace_at
from router.llm_body import content_text, conversation_of, request_facts, texts_to_route
from router.classifier import Decision, RouteClassifier
from esr_config import RouterConfig
from router.conversation import deciding_turn
from router.rules import RequestFacts
from router.static_tier import StaticTier
from esr_tuning.calibration import conversation_examples
from esr_tuning.decide import decide_requests
from esr_tuning.fit import FitResult, fit, with_calibration
from esr_tuning.jsonl import BadRecord, first_record, known_label, read_records

SHORT_WORDS = 6  # a user turn of at most this many words counts as a short follow-up


@dataclass(frozen=True)
class Dialogue:
    turns: list[str]  # the user's turns, oldest first
    labels: list[str]  # the route of each
    systems: list[str | None] | None = None  # per turn, the system prompt of the request it ends
    facts: list[RequestFacts] | None = None  # per turn, what rules read of the request it ends

    def routed(self, config: RouterConfig) -> list[tuple[str, ...]]:
        """Per user turn, the texts the router embeds for the request that ends with it."""
        systems = self.systems or [None] * len(self.turns)
        return [texts_to_route(self.turns[: t + 1], systems[t], config.requests, config.conversation.turns_read)[0]
                for t in range(len(self.turns))]


def is_conversation_data(path: str | Path) -> bool:
    """Whether the file's first record is a conversation (else {text, label} lines)."""
    row = first_record(path)
    return isinstance(row, dict) and "messages" in row


def load_dialogues(path: str | Path, allowed: Sequence[str], harness_tags: Sequence[str] = ()) -> list[Dialogue]:
    """Each user message is read as the router reads it (router.llm_body.content_text): its text
    parts, less the blocks of `harness_tags` (requests.harness_tags). A message left with no text is
    no turn to the router, so it and its label are passed over."""
    allowed_set, strip = set(allowed), tuple(harness_tags)

    def parse(row: dict) -> Dialogue:
        messages = row["messages"]
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        labels = row["labels"]
        if not isinstance(labels, list):
            raise TypeError("labels")
        if len(labels) != len(users):
            raise BadRecord(f"{len(labels)} labels for {len(users)} user messages")
        top = {"system": row["system"]} if "system" in row else {}  # Anthropic's top-level system
        turns, kept_labels, systems, facts = [], [], [], []
        for i, label in zip(users, labels):
            text = content_text(messages[i]["content"], strip)
            if text is None:
                continue
            turns.append(text)
            kept_labels.append(known_label(label, allowed_set))
            # the system prompt of the request that ends with this turn, as the router reads it
            request = {**top, "messages": messages[: i + 1]}
            systems.append(conversation_of(request, "/v1/chat/completions", strip)[1])
            facts.append(request_facts(request, "/v1/chat/completions"))
        if not turns:
            raise BadRecord("no user message with text")
        return Dialogue(turns, kept_labels, systems, facts)

    return read_records(path, parse, '{"messages": [{"role", "content"}, ...], "labels": [...]}', "conversations")


@dataclass(frozen=True)
class TurnTable:
    """Every user turn of a set of dialogues, flattened, with what the metrics split on."""

    labels: list[str]
    short: np.ndarray  # bool: a follow-up of at most SHORT_WORDS words
    switch: np.ndarray  # bool: its label differs from the previous user turn's
    dialogue_of: np.ndarray  # index of its dialogue
    position: np.ndarray  # its index within the dialogue

    @classmethod
    def of(cls, dialogues: Sequence[Dialogue]) -> "TurnTable":
        labels, short, switch, dialogue_of, position = [], [], [], [], []
        for d, dialogue in enumerate(dialogues):
            for t, (text, label) in enumerate(zip(dialogue.turns, dialogue.labels)):
                labels.append(label)
                short.append(len(text.split()) <= SHORT_WORDS)
                switch.append(t > 0 and label != dialogue.labels[t - 1])
                dialogue_of.append(d)
                position.append(t)
        return cls(labels, np.asarray(short), np.asarray(switch), np.asarray(dialogue_of), np.asarray(position))


def routed_texts(config: RouterConfig, dialogues: Sequence[Dialogue]) -> list[str]:
    """The distinct texts the router embeds for every request of `dialogues`."""
    return sorted({text for d in dialogues for texts in d.routed(config) for text in texts})


def _turn_scores(config: RouterConfig, classifier: RouteClassifier, dialogues: Sequence[Dialogue],
                 vectors: dict[str, np.ndarray]) -> list[list[np.ndarray]]:
    """Per dialogue and user turn, the scores of the texts its request is routed on (oldest first):
    independent of the gate, so computed once."""
    return [[classifier.scores(np.stack([vectors[t] for t in texts])) for texts in d.routed(config)]
            for d in dialogues]


def predict(config: RouterConfig, classifier: RouteClassifier, dialogues: Sequence[Dialogue],
            vectors: dict[str, np.ndarray], static: StaticTier | None = None) -> list[Decision]:
    """The decision of every user turn (flattened as TurnTable), as the router makes it
    (esr_tuning/decide.py: RoutingEngine.decide) on the texts its request is routed on, with `static`
    as its first tier (None: off)."""
    requests = []
    for d in dialogues:
        facts = d.facts or [RequestFacts()] * len(d.turns)
        requests += list(zip(d.routed(config), facts))
    return decide_requests(config, classifier, requests, vectors, static)


def _choices(config: RouterConfig, classifier: RouteClassifier, turn_scores: list[list[np.ndarray]],
             gate: float | None) -> list[str]:
    names = [r.name for r in config.routes]
    out = []
    for dialogue in turn_scores:
        for scores in dialogue:
            _, choice = deciding_turn(classifier, scores, gate)
            out.append(names[choice] if choice >= 0 else config.default_route.name)
    return out


def conversation_metrics(table: TurnTable, predicted: Sequence[str]) -> dict:
    hit = np.asarray(predicted) == np.asarray(table.labels)

    def share(mask: np.ndarray) -> float | None:
        return round(float(hit[mask].mean()), 4) if mask.any() else None

    return {
        "turns": len(hit),
        "all_turns": share(np.ones_like(hit)),
        "short_followups": share(table.short & (table.position > 0)),
        "topic_changes": share(table.switch),
        "short_followups_count": int((table.short & (table.position > 0)).sum()),
        "topic_changes_count": int(table.switch.sum()),
    }


def gate_objective(metrics: dict) -> float:
    """What fitting the gate maximises: all turns and topic changes weigh alike, since a gate that
    only keeps routes wins on all turns (changes are ~10% of them) while missing every change."""
    return 0.5 * metrics["all_turns"] + 0.5 * (metrics["topic_changes"] if metrics["topic_changes"] is not None else metrics["all_turns"])


def tune_gate(config: RouterConfig, classifier: RouteClassifier, dialogues: Sequence[Dialogue],
              vectors: dict[str, np.ndarray]) -> tuple[float | None, dict]:
    """The gate (None: winning is decisive) that maximises `gate_objective` on `dialogues`, and its metrics."""
    table = TurnTable.of(dialogues)
    turn_scores = _turn_scores(config, classifier, dialogues, vectors)
    own = np.stack([scores[-1] for dialogue in turn_scores for scores in dialogue])  # each turn's own text
    candidates: list[float | None] = [None] + [round(float(q), 4) for q in np.unique(
        np.quantile(own.max(axis=1), np.linspace(0.0, 0.99, 100)))]
    best = None
    for gate in candidates:
        m = conversation_metrics(table, _choices(config, classifier, turn_scores, gate))
        if best is None or gate_objective(m) > gate_objective(best[1]):
            best = (gate, m)
    if best is None:
        raise ValueError("no gates to choose from")
    return best


def split_dialogues(dialogues: Sequence[Dialogue], holdout: float, seed: int) -> tuple[list[Dialogue], list[Dialogue]]:
    order = np.random.default_rng(seed).permutation(len(dialogues))
    cut = max(1, int(round(len(dialogues) * holdout)))
    return [dialogues[i] for i in sorted(order[cut:])], [dialogues[i] for i in sorted(order[:cut])]


def with_gate(config: RouterConfig, gate: float | None) -> RouterConfig:
    return replace_at(config, "conversation", policy="track", gate=gate)


def turn_examples(config: RouterConfig, dialogues: Sequence[Dialogue],
                  vectors: dict[str, np.ndarray]) -> tuple[np.ndarray, list[str]]:
    """Every user turn as a labelled example, as the router embeds it (its own text, or joined with
    the turns before it under last_turns); a turn such as "Yes." recurs under many labels: so a head
    learns that it names no route."""
    texts = [texts[-1] for d in dialogues for texts in d.routed(config)]
    return np.stack([vectors[t] for t in texts]), [label for d in dialogues for label in d.labels]


def fit_conversations(config: RouterConfig, encode, dialogues: Sequence[Dialogue], vectors: dict[str, np.ndarray],
                      holdout: float = 0.2, seed: int = 0, **fit_args) -> FitResult:
    """`esr_tuning.fit.fit` on every user turn, and the gate chosen on held-out dialogues: fitted on the
    rest first, so the gate is judged on conversations the head has not seen."""
    train, tune = split_dialogues(dialogues, holdout, seed)
    first = fit(config, encode, *turn_examples(config, train, vectors), seed=seed, **fit_args)
    first_classifier = RouteClassifier(first.config, encode, head=first.head)
    gate, held_out = tune_gate(first.config, first_classifier, tune, vectors)
    # The gate is on the scale of the first fit's scores: the second keeps them.
    fit_args["head_score"] = first.config.classifier.head_score
    result = fit(config, encode, *turn_examples(config, dialogues, vectors), seed=seed, **fit_args)
    result.notes[:0] = [f"on the dialogues the gate is not chosen on: {note}" for note in first.notes]
    result.config = with_gate(result.config, gate)
    # Confidence is calibrated per user turn of the held-out dialogues, decided with the gate.
    examples = conversation_examples(first_classifier, _turn_scores(first.config, first_classifier, tune, vectors),
                                     TurnTable.of(tune).labels, gate)
    result.notes.append("on the held-out dialogues:")
    result.config = with_calibration(result.config, examples, fit_args.get("calibration_share"), result.notes)
    result.notes.append(
        f"conversation gate {gate} chosen on {len(tune)} held-out dialogues ({held_out['turns']} turns): all turns "
        f"{held_out['all_turns']}, short follow-ups {held_out['short_followups']}, topic changes {held_out['topic_changes']}"
    )
    return result
