"""The labelled files eval and fit read: one reader, lines named when wrong, turns read as the router reads them."""

import json

import pytest

from router.config import HARNESS_TAGS
from esr_tuning.conversations import is_conversation_data, load_dialogues
from esr_tuning.evaluation import load_labelled

ROUTES = ["math", "code", "general"]


def write(tmp_path, *rows, raw: str = "") -> str:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n\n" for r in rows) + raw)  # blank lines are skipped
    return str(path)


def test_examples_keep_their_intents_only_when_every_line_has_one(tmp_path):
    data = load_labelled(write(tmp_path, {"text": "2+2", "label": "math", "intent": "add"},
                               {"text": "hi", "label": "general", "intent": "greet"}), ROUTES)
    assert (data.texts, data.labels, data.intents) == (["2+2", "hi"], ["math", "general"], ["add", "greet"])
    assert load_labelled(write(tmp_path, {"text": "2+2", "label": "math", "intent": "add"},
                               {"text": "hi", "label": "general"}), ROUTES).intents is None


@pytest.mark.parametrize("raw, reason", [
    ("{not json\n", 'expected {"text": ..., "label": ...}'),
    ('["text", "label"]\n', 'expected {"text": ..., "label": ...}'),
    ('{"text": "x"}\n', 'expected {"text": ..., "label": ...}'),
    ('{"text": "x", "label": ["math"]}\n', 'expected {"text": ..., "label": ...}'),
    ('{"text": "x", "label": "poetry"}\n', "label 'poetry' is not a route or the default route"),
])
def test_a_bad_example_line_is_named(tmp_path, raw, reason):
    path = write(tmp_path, {"text": "2+2", "label": "math"}, raw=raw)
    with pytest.raises(ValueError) as err:
        load_labelled(path, ROUTES)
    assert str(err.value).startswith(f"{path}:3: {reason}")  # line 2 is blank


def test_an_empty_file_says_so(tmp_path):
    path = write(tmp_path, raw="\n\n")
    with pytest.raises(ValueError, match="no examples"):
        load_labelled(path, ROUTES)
    with pytest.raises(ValueError, match="no conversations"):
        load_dialogues(path, ROUTES)
    assert not is_conversation_data(path)


def test_harness_blocks_are_cut_from_turns_as_the_router_cuts_them(tmp_path):
    reminder = "<system-reminder>the user is working in repo X; prefer code answers</system-reminder>"
    path = write(tmp_path, {"messages": [
        {"role": "user", "content": "solve 2x + 3 = 7"},
        {"role": "assistant", "content": "x = 2"},
        {"role": "user", "content": reminder},  # harness text only: no turn to the router, label passed over
        {"role": "user", "content": [{"type": "text", "text": reminder + "\nnow write it in python"},
                                     {"type": "image_url", "image_url": {"url": "data:,"}}]},
    ], "labels": ["math", "code", "code"]})
    assert is_conversation_data(path)
    [dialogue] = load_dialogues(path, ROUTES, HARNESS_TAGS)
    assert dialogue.turns == ["solve 2x + 3 = 7", "now write it in python"]
    assert dialogue.labels == ["math", "code"]
    # Without the tags the reminder is a turn of its own, as it would be to a router told no tags.
    assert len(load_dialogues(path, ROUTES)[0].turns) == 3


@pytest.mark.parametrize("record, reason", [
    ({"messages": [{"role": "user", "content": "hi"}], "labels": []}, "0 labels for 1 user messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "labels": ["poetry"]}, "label 'poetry' is not a route"),
    ({"messages": [{"role": "user", "content": "  "}], "labels": ["general"]}, "no user message with text"),
    ({"messages": [{"content": "hi"}], "labels": ["general"]}, "expected {\"messages\""),
    ({"messages": "hi", "labels": ["general"]}, "expected {\"messages\""),
    ({"messages": [{"role": "user", "content": "hi"}], "labels": "general"}, "expected {\"messages\""),
])
def test_a_bad_conversation_line_is_named(tmp_path, record, reason):
    path = write(tmp_path, record)
    with pytest.raises(ValueError) as err:
        load_dialogues(path, ROUTES)
    assert str(err.value).startswith(f"{path}:1: {reason}")
