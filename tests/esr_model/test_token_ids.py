"""A front end's token ids are the ids the model process would make itself, for any text and any cut."""

from __future__ import annotations

import array
import random
import string
from pathlib import Path

import pytest

from esr_config import EncoderConfig
from esr_model.location import resolve_model
from esr_model.onnx_encoder import OnnxEncoder
from esr_model.token_ids import MAX_TOKENIZED_CHARS, FrontEndTokens, read_ids

MODEL = Path(resolve_model("bundled:all-MiniLM-L6-v2"))


@pytest.fixture(scope="module")
def front_end() -> FrontEndTokens:
    return FrontEndTokens(MODEL)


def texts() -> list[str]:
    rng = random.Random(0)
    words = ["route", "me", "to", "the", "cheapest", "model", "unbelievably", "x" * 120, "C++", "naïve", "日本語",
             "emoji 🚀", "[SEP]", "tab\there", "new\nline", "\x07bell", "don't", "3.14", "#hashtag", ""]
    made = ["", " ", "hello", "Hello, World!", "[CLS] a special token's text", "Zürich café résumé"]
    for _ in range(150):
        made.append(" ".join(rng.choice(words) for _ in range(rng.randint(1, 40))))
        made.append("".join(rng.choice(string.printable) for _ in range(rng.randint(1, 300))))
    made.append(" ".join(["long"] * 600))  # past every window: cut
    return made


@pytest.mark.parametrize("keep,window", [("head", 256), ("tail", 32), ("ends", 17)])
def test_a_front_end_makes_the_ids_the_model_process_would(front_end, keep, window):
    # OnnxEncoder tokenizes with the library (a CPU model process); the front end with the word cache
    model = OnnxEncoder(EncoderConfig(backend="onnx", cpu_threads=1, max_seq_length=window), keep=keep)
    make = front_end.maker(model.token_spec())
    assert make is not None
    sample = texts()
    for text, ids in zip(sample, model.tokenize(sample)):
        sent = make(text)
        assert list(array.array("I", sent)) == ids, text
        assert model.read_ids(sent) == ids


def test_the_torch_encoder_a_gpu_runs_takes_the_same_front_ends_ids(front_end):
    from esr_model.encoder import SentenceEncoder

    torch_model = SentenceEncoder(EncoderConfig(backend="torch", device="cpu", cpu_threads=1))
    assert front_end.maker(torch_model.token_spec()) is not None


def test_a_front_end_sends_text_to_a_model_of_another_tokenizer_and_for_a_text_too_long_to_tokenize_on_its_loop(
        front_end):
    spec = OnnxEncoder(EncoderConfig(backend="onnx", cpu_threads=1)).token_spec()
    assert front_end.maker({**spec, "digest": "another tokenizer"}) is None
    assert front_end.maker(None) is None and front_end.maker({}) is None
    assert front_end.maker({**spec, "keep": "middle"}) is None and front_end.maker({**spec, "max": 1}) is None
    make = front_end.maker(spec)
    assert make("a" * MAX_TOKENIZED_CHARS) is not None and make("a" * (MAX_TOKENIZED_CHARS + 1)) is None


def test_ids_a_model_cannot_read_are_refused_with_the_reason():
    ok = array.array("I", [101, 7592, 102]).tobytes()
    assert read_ids(ok, 3, 30522) == [101, 7592, 102]
    for raw, reason in [(ok[:-1], "whole u32s"), (b"", "1 to 3"), (ok + ok[:4], "1 to 3"),
                        (array.array("I", [101, 30522]).tobytes(), "vocabulary")]:
        with pytest.raises(ValueError, match=reason):
            read_ids(raw, 3, 30522)
