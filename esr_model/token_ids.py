"""Token ids a front end makes for the model process, which then does not tokenize: which tokenizer
makes them (a digest both ends compute), and the ids as the model socket carries them.

Why: in a pool every front end's prompts meet in one model process, whose Python (one GIL) is what
a GPU waits on; tokenizing there was a third of its CPU per embedding (docs/scale-out.md). A front
end has the same tokenizer files (the static tier reads them too), and there are many front ends.
"""

from __future__ import annotations

import array
import hashlib
from pathlib import Path
from typing import Callable

from esr_model.truncation import Keep, cut_ids
from esr_model.wordpiece_cache import WordPieceCache

# u32 ids in the host's byte order: both ends of a Unix socket run on one host.
_ID = "I"
assert array.array(_ID).itemsize == 4
# Longer texts go to the model process as text: tokenizing them costs the front end's event loop
# more than it saves the model process (8 KiB of words is ~2,000 tokens, cut to the window anyway).
MAX_TOKENIZED_CHARS = 8192


def plain(tokenizer):
    """A copy of a `tokenizers.Tokenizer` that neither pads nor truncates (a model's own may do
    both; ids are cut by truncation.cut_ids, keeping the ends a config asks for)."""
    from tokenizers import Tokenizer

    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.no_padding()
    copy.no_truncation()
    return copy


def tokenizer_digest(tokenizer) -> str:
    """What identifies a `tokenizers.Tokenizer`'s ids: its whole definition (vocabulary, normalizer,
    pre-tokenizer, model, post-processor), padding and truncation left out (neither end uses them)."""
    return hashlib.blake2b(plain(tokenizer).to_str().encode(), digest_size=16).hexdigest()


def vocab_size(tokenizer) -> int:
    """The ids a tokenizer can make: its vocabulary and added tokens (what read_ids checks against)."""
    return tokenizer.get_vocab_size(with_added_tokens=True)


def token_spec(tokenizer, max_tokens: int, keep: Keep) -> dict:
    """What a model process says of the ids it takes (its HELLO's "tokens"): a front end whose
    tokenizer has the same digest sends ids cut as these say."""
    return {"digest": tokenizer_digest(tokenizer), "max": max_tokens, "keep": keep, "vocab": vocab_size(tokenizer)}


def read_ids(raw: bytes, max_tokens: int, vocab: int) -> list[int]:
    """Ids a front end sent, checked as the model would need them: whole u32s, within the window, each
    in the vocabulary. ValueError otherwise (that request alone fails). A list, as tokenize gives: the
    model thread pads lists faster than arrays, and it is the thread a GPU waits on."""
    if len(raw) % 4:
        raise ValueError(f"token ids of {len(raw)} bytes: not whole u32s")
    ids = array.array(_ID, raw)
    if not 0 < len(ids) <= max_tokens:
        raise ValueError(f"{len(ids)} token ids; 1 to {max_tokens}")
    if max(ids) >= vocab:
        raise ValueError(f"token id {max(ids)} is outside the vocabulary of {vocab}")
    return ids.tolist()


class FrontEndTokens:
    """A front end's copy of the encoder's tokenizer (from the model directory it routes with)."""

    def __init__(self, model_dir: str | Path):
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self._words = WordPieceCache(tokenizer)
        self.digest = tokenizer_digest(tokenizer)

    def maker(self, spec: dict | None) -> Callable[[str], bytes | None] | None:
        """What makes the ids the model process that sent `spec` takes (a text's ids as the wire
        carries them; None for a text it should send as text); None where it takes none, or another
        tokenizer's."""
        if not isinstance(spec, dict) or spec.get("digest") != self.digest:
            return None
        max_tokens, keep = spec.get("max"), spec.get("keep")
        if not isinstance(max_tokens, int) or max_tokens < 2 or keep not in ("head", "tail", "ends"):
            return None
        words = self._words

        def ids(text: str) -> bytes | None:
            if len(text) > MAX_TOKENIZED_CHARS:
                return None
            return array.array(_ID, cut_ids(words.ids(text), max_tokens, keep)).tobytes()

        return ids
