"""`semantic-router eval` scores a conversation exactly as the served router routes it: under each
conversation policy and request setting, every user turn's route from eval's code path
(esr_tuning.conversations.predict on the offline encoder, as cmd_eval runs it) equals the
`x-semantic-route` (and its reason and confidence) a real Envoy + router stack answers for the
request that ends with that turn."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml

from esr_app.quality_cli import offline, text_vectors
from esr_app.routing_build import static_tier
from devstack.stack import stack_with
from esr_config import load_config
from esr_tuning.conversations import Dialogue, load_dialogues, predict, routed_texts

# A system prompt that leans to one route: joined in (include_system) it moves decisions.
SYSTEM = ("You are a coding assistant: write a python function, fix the segmentation fault in my C program, "
          "write a unit test for this function with pytest.")

# (role, content) messages; the labels only satisfy the data format, decisions are compared.
CONVERSATIONS = [
    [("system", SYSTEM), ("user", "solve 3x - 5 = 10"), ("assistant", "x = 5"),
     ("user", "thanks, and what about 2x + 1 = 9?"), ("assistant", "x = 4"), ("user", "great"),
     ("user", "now write a python function that sorts a list of tuples by their second item")],
    [("system", SYSTEM), ("user", "my rust program panics with index out of bounds"), ("assistant", "Show me the code."),
     ("user", "ok"), ("assistant", "..."), ("user", "what is the integral of x squared?"),
     ("assistant", "x^3/3 + C"), ("user", "yes please explain")],
    [("user", "hello, how are you today?"), ("assistant", "Fine."), ("user", "tell me a joke about cats"),
     ("system", "Be funny."), ("user", "another one"), ("assistant", "..."), ("user", "compute 17 * 23")],
    [("system", SYSTEM), ("user", "hello, how are you today?"), ("assistant", "Fine."),
     ("user", "tell me a joke about cats")],
    [("system", SYSTEM + " " + "Always cite sources. " * 40), ("user", "how do I reverse a linked list in java"),
     ("assistant", "Iteratively."), ("user", "and recursively?"), ("user", "what is the derivative of sin(x) times x")],
]

# Each setting, and a neighbour of it whose offline routes must differ from the served ones: so
# the comparison can fail (eval before texts_to_route ignored the system prompt and the cap).
SETTINGS = {
    "track": ({}, {"conversation": {"max_turns": 1}}),  # router.yaml: track, 8 turns
    "last_turns_3_with_system": ({"conversation": {"policy": "last_turns"},
                                  "requests": {"prompt_turns": 3, "include_system": True}},
                                 {"requests": {"include_system": False}}),
    "last_turns_2_capped": ({"conversation": {"policy": "last_turns"},
                             "requests": {"prompt_turns": 2, "include_system": True, "prompt_max_tokens": 12}},
                            {"requests": {"prompt_max_tokens": 256}}),
    # Rules decide before the model, on the whole prompt's estimated tokens (the last conversation's
    # long system prompt) and on keywords; the confidence comes from a calibration section.
    "rules_and_calibration": ({"rules": [{"when": {"keywords": ["joke"]}, "route": "math"},
                                         {"when": {"min_prompt_tokens": 250}, "route": "general"}],
                               "calibration": {"matched": [-3.0, 9.0, 6.0, 0.0], "context": [-2.0, 5.0, 3.0, 0.0],
                                               "default": [0.4], "fallback": 0.1}},
                              {"rules": []}),
    # The cascade: the static tier decides the turns it leads by these margins (set by hand here;
    # fit measures them), the encoder the rest, each decision saying which tier made it.
    "cascade": ({"static_tier": {"enabled": True, "accept": {"math": 0.12, "code": 0.12}}},
                {"static_tier": {"enabled": False}}),
}


def edited(config: dict, *changes: dict) -> dict:
    for change in changes:
        for section, values in change.items():
            if isinstance(values, dict):
                config.setdefault(section, {}).update(values)
            else:
                config[section] = values
    return config


def dialogue(messages, path: Path) -> Dialogue:
    """What load_dialogues reads from the same conversation as a JSONL record."""
    users = sum(role == "user" for role, _ in messages)
    path.write_text(json.dumps({"messages": [{"role": r, "content": c} for r, c in messages],
                                "labels": ["general"] * users}) + "\n")
    return load_dialogues(path, ["math", "code", "general"])[0]


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_every_turn_is_routed_by_the_server_as_eval_scores_it(tmp_path, envoy_binary, setting):
    own, neighbour = SETTINGS[setting]

    def change(config):
        edited(config, own, {"server": {"deadline_ms": 60000}})  # no fallback decides a turn on a busy machine

    dialogues = [dialogue(m, tmp_path / f"dialogue{i}.jsonl") for i, m in enumerate(CONVERSATIONS)]
    with stack_with(tmp_path, change) as stack:
        served = []
        with httpx.Client(base_url=stack.url, timeout=70) as client:
            for messages in CONVERSATIONS:
                for i, (role, _) in enumerate(messages):
                    if role != "user":
                        continue
                    body = {"model": "auto", "messages": [{"role": r, "content": c} for r, c in messages[: i + 1]]}
                    answer = client.post("/v1/chat/completions", json=body)
                    assert answer.status_code == 200, answer.text
                    assert answer.headers["x-semantic-route-reason"] in ("matched", "context", "default", "keyword", "rule")
                    served.append(tuple(answer.headers.get(h, "") for h in SHOWN))
        config = load_config(tmp_path / "router.yaml")
    encoder, classifier = offline(config)
    scored = predict(config, classifier, dialogues, text_vectors(encoder, routed_texts(config, dialogues)),
                     static_tier(config))
    assert [_shown(d) for d in scored] == served
    assert len({route for route, *_ in served}) > 1
    (tmp_path / "neighbour.yaml").write_text(yaml.safe_dump(edited(yaml.safe_load((tmp_path / "router.yaml").read_text()), neighbour)))
    other = load_config(tmp_path / "neighbour.yaml")
    assert [_shown(d) for d in predict(other, classifier, dialogues, text_vectors(encoder, routed_texts(other, dialogues)),
                                       static_tier(other))] != served
    if setting == "cascade":
        assert {"static", "encoder"} <= {tier for *_, tier in served}


SHOWN = ("x-semantic-route", "x-semantic-route-reason", "x-semantic-route-confidence", "x-semantic-route-tier")


def _shown(decision) -> tuple[str, str, str, str]:
    """What the served answer's headers say of a decision."""
    return decision.route, decision.reason, f"{decision.confidence:.4f}", decision.tier

