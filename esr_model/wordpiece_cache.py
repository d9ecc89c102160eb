"""The static tier's tokenizer for plain ASCII text: a BERT uncased WordPiece tokenizer's ids, a word
at a time from a cache, the same ids the `tokenizers` library gives (tests/esr_model/test_wordpiece_cache.py
checks any ASCII text against it).

Why: the static tier tokenizes on the event loop, and the library's call cost ~25 µs a prompt alone
and more beside the router's other threads (it releases the GIL, and takes it back behind them):
a large share of a static decision's time in the router (docs/notes/static-tier-history.md). Words repeat, so a cache of
their pieces makes a prompt a lowercase, a regex split and some dict lookups. Text it cannot vouch
for (not ASCII, control characters, a special token's text) goes to the library, as does a
tokenizer that is not BERT's normalizer, pre-tokenizer and WordPiece.
"""

from __future__ import annotations

import re

# After BERT's normalizer on ASCII text (control characters other than tab and newlines excluded:
# it drops those), its pre-tokenizer's pieces: runs of letters and digits, and each punctuation
# character alone (every printable ASCII character that is neither is punctuation to BERT).
_PIECES = re.compile(r"[a-z0-9]+|[^a-z0-9\s]")
_DROPPED = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
MAX_WORDS = 1 << 16  # words cached; the cache starts over past it


class WordPieceCache:
    def __init__(self, tokenizer):
        """`tokenizer`: a `tokenizers.Tokenizer`, which `ids` calls itself for text it leaves to it."""
        from tokenizers import models, normalizers, pre_tokenizers

        self.tokenizer = tokenizer
        model, norm = tokenizer.model, tokenizer.normalizer
        self.usable = (isinstance(model, models.WordPiece) and isinstance(norm, normalizers.BertNormalizer)
                       and norm.lowercase and norm.clean_text and norm.strip_accents in (None, True)
                       and isinstance(tokenizer.pre_tokenizer, pre_tokenizers.BertPreTokenizer))
        if not self.usable:
            return
        self.vocab = tokenizer.get_vocab()
        self.unk = self.vocab[model.unk_token]
        self.prefix = model.continuing_subword_prefix
        self.max_chars = model.max_input_chars_per_word
        self.specials = [t.content.lower() for t in tokenizer.get_added_tokens_decoder().values()]
        self.first, self.last = self._ends()
        self.words: dict[str, list[int]] = {}

    def _ends(self) -> tuple[list[int], list[int]]:
        """What the post-processor puts around a text's pieces ([CLS] ... [SEP])."""
        empty = self.tokenizer.encode("").ids
        probe = self.tokenizer.encode("a").ids
        piece = self.vocab.get("a")
        at = probe.index(piece) if piece in probe else len(empty)
        return empty[:at], empty[at:]

    def ids(self, text: str) -> list[int]:
        """The tokenizer's ids for `text`, special tokens included."""
        if not self.usable or not text.isascii() or _DROPPED.search(text):
            return self.tokenizer.encode(text).ids
        lowered = text.lower()
        if any(s in lowered for s in self.specials):
            return self.tokenizer.encode(text).ids
        out = list(self.first)
        words = self.words
        for word in _PIECES.findall(lowered):
            pieces = words.get(word)
            if pieces is None:
                if len(words) >= MAX_WORDS:
                    words.clear()
                pieces = words[word] = self._pieces(word)
            out += pieces
        out += self.last
        return out

    def _pieces(self, word: str) -> list[int]:
        """WordPiece: the longest vocabulary entry from the left, again and again; [UNK] for the whole
        word where none fits, or where it is longer than max_input_chars_per_word."""
        if len(word) > self.max_chars:
            return [self.unk]
        out, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else self.prefix + word[start:end]
                found = self.vocab.get(piece)
                if found is not None:
                    out.append(found)
                    break
                end -= 1
            else:
                return [self.unk]
            start = end
        return out
