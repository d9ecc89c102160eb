"""Deterministic synthetic prompt workloads (no dataset needed, so they run on any machine)."""

from __future__ import annotations

import random
from pathlib import Path

# The datasets beside the project (../shared/data: CLINC150, SGD; each with its README and credit).
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
# CLINC150's small-talk intents with one fixed answer: what a response cache may keep.
FIXED = {"are_you_a_bot", "do_you_have_pets", "goodbye", "greeting", "how_old_are_you", "meaning_of_life",
         "tell_joke", "thank_you", "what_are_your_hobbies", "what_can_i_ask_you", "what_is_your_name",
         "where_are_you_from", "who_do_you_work_for", "who_made_you"}


_WORDS = (
    "how what why when where which could would should please explain solve write compute find show "
    "the a an of to in for on with by from about into over under between this that these those my your "
    "function equation integral derivative matrix python java rust server request database query error "
    "table list string number value vector model route gateway latency budget weather travel recipe "
    "history music movie book story planet energy market price report summary language translate"
).split()


def _sentence(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n_words)).capitalize() + "?"


def short_prompts(n: int, seed: int = 1) -> list[str]:
    """About 10 tokens each (6-9 words plus specials and punctuation)."""
    rng = random.Random(seed)
    return [_sentence(rng, rng.randint(6, 9)) for _ in range(n)]


def mixed_prompts(n: int, seed: int = 2) -> list[str]:
    """A realistic spread up to the encoder's 256-token limit: mostly short chat turns, a long tail."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = min(250, max(4, int(rng.lognormvariate(3.4, 0.9))))
        out.append(_sentence(rng, words))
    return out


WORKLOADS = {"short": short_prompts, "mixed": mixed_prompts}
