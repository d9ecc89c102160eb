"""The static tier's word-cache tokenizer gives exactly the `tokenizers` library's ids, whatever the
text: ASCII it reads itself, anything else it hands to the library."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from esr_model.location import resolve_model
from esr_model.wordpiece_cache import MAX_WORDS, WordPieceCache


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    tok = Tokenizer.from_file(str(Path(resolve_model("bundled:all-MiniLM-L6-v2")) / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok


@pytest.fixture(scope="module")
def cache(tokenizer) -> WordPieceCache:
    words = WordPieceCache(tokenizer)
    assert words.usable  # the bundled model is BERT uncased: the fast path is the one tested
    return words


ASCII = st.text(alphabet=st.sampled_from(string.printable + "\x00\x01\x0b\x0c\x1f\x7f"), max_size=80)


@settings(max_examples=3000, deadline=None)
@given(ASCII)
def test_any_ascii_text_gets_the_librarys_ids(cache, tokenizer, text):
    assert cache.ids(text) == tokenizer.encode(text).ids


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_any_text_at_all_gets_the_librarys_ids(cache, tokenizer, text):
    assert cache.ids(text) == tokenizer.encode(text).ids


@pytest.mark.parametrize("text", [
    "", "solve 2x + 3 = 7", "What's the derivative of x^3?", "x" * 100, "x" * 101, "a" * 300 + " b",
    "[CLS] hi [SEP]", "what is [MASK]", "[unk]", "café au lait", "naïve", "日本語", "tabs\tand\nnew\rlines",
    "a\x0bb\x0cc", "null\x00byte", "unbelievably antidisestablishmentarianism", "C++ and C# and F#",
])
def test_shapes_that_differ_in_how_they_are_cut(cache, tokenizer, text):
    assert cache.ids(text) == tokenizer.encode(text).ids


def test_the_cache_starts_over_when_full(tokenizer):
    words = WordPieceCache(tokenizer)
    for i in range(MAX_WORDS + 5):
        words.ids(f"w{i}")
    assert len(words.words) <= MAX_WORDS
    assert words.ids("w3 again") == tokenizer.encode("w3 again").ids
