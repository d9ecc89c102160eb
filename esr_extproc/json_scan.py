"""A strict JSON scanner and splicer for request bodies as Envoy hands them over: top-level members
found without decoding their values, a body refused where backends could read it another way than
the router (a repeated or case-variant key, data after the object, not UTF-8, too deep), and member
values replaced byte-exact, every other byte as the client sent it."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, MutableMapping
from typing import Any

class BadBody(ValueError):
    """The body cannot be used; `kind` is the metric label and the log key."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind

    def __reduce__(self):  # crosses from the body-parsing worker process intact
        return BadBody, (self.kind, str(self))


def member_bytes(value: Any) -> bytes:
    """A member's value as with_members writes it into the forwarded body."""
    return json.dumps(value).encode()


def element_starts(text: str, start: int) -> list[int]:
    """Where each element of the JSON array at `start` begins."""
    starts: list[int] = []
    i = _SPACE.match(text, start + 1).end()  # type: ignore[union-attr]
    if text[i : i + 1] == "]":
        return starts
    while True:
        starts.append(i)
        i = _SPACE.match(text, _value_end(text, i)).end()  # type: ignore[union-attr]
        if text[i : i + 1] != ",":
            return starts
        i = _SPACE.match(text, i + 1).end()  # type: ignore[union-attr]


# Kinds a body is refused for, never routed to the default (esr_extproc.body_phase.REFUSED): a backend
# could read such a body, and read it differently from the router (a repeated or case-variant key,
# data after the object, a charset other than UTF-8) or not at all (too deep).
AMBIGUOUS = ("duplicate_key", "case_variant_key", "trailing_data", "not_utf8", "byte_order_mark", "too_deep")


def fold(key: str) -> str:
    """A member name as a case-insensitive reader matches it. Go's encoding/json folds each rune
    through upper then lower case, so "meſſages" (long s) and "\u212aey" (Kelvin sign) match too."""
    return key.lower() if key.isascii() else key.upper().lower()


class DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Backends differ on which copy of a repeated key wins (Python's json: the last; many others:
    # the first), so a body with one is ambiguous: the router could route on a prompt or model
    # the backend never sees. Linear: naming the repeat by re-scanning prefixes was O(n^2) (a
    # 24,000-key object held the event loop for tens of seconds).
    # Keys are also compared folded: Go's encoding/json matches struct fields case-insensitively,
    # the last match winning, so {"content": "hi", "Content": "..."} is read as the second.
    d = dict(pairs)
    if len(d) != len(pairs) or (len(d) > 1 and len({fold(k) for k in d}) != len(d)):
        seen: set[str] = set()
        for k, _ in pairs:
            if fold(k) in seen:
                raise DuplicateKey(k)
            seen.add(fold(k))
    return d


_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates)


_SPACE = re.compile(r"[ \t\n\r]*")


def utf8_text(raw: bytes) -> str:
    """Strict UTF-8 (RFC 8259). A body backends could read another way is refused: Python's
    json.loads on bytes reads UTF-16/32 (told by their NUL bytes, which JSON never holds raw) and
    skips a byte-order mark; Go's reads invalid UTF-8 as U+FFFD."""
    if not raw:
        raise BadBody("empty", "empty body")
    if raw.startswith(b"\xef\xbb\xbf"):
        raise BadBody("byte_order_mark", "body starts with a byte-order mark: send UTF-8 JSON without one")
    if b"\x00" in raw:
        raise BadBody("not_utf8", "body holds NUL bytes (UTF-16 or UTF-32?): send UTF-8 JSON")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadBody("not_utf8", "body is not UTF-8: send UTF-8 JSON") from None


# Finding where a value ends without building it: C-speed regex scans, so a 4 MiB member the
# router never reads costs milliseconds, not the ~100 ms (on the event loop) of decoding it.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)


_PLAIN = re.compile(r'[^"\[\]{}]*')  # a run with nothing structural: sre's fast character-class loop


_SCALAR = re.compile(r"[^,}\]\s]+")


# Deeper nesting is refused: no LLM API nests near this (tool schemas run to a few dozen), Python
# backends fail near 1,000, and the decoder recurses once per level.
MAX_DEPTH = 128


def _string_end(text: str, i: int) -> int:
    m = _STRING.match(text, i)
    if m is None:
        raise ValueError("unterminated string")
    return m.end()


class OutOfTime(Exception):
    """A scan passed its deadline (a parse in the worker process stops, not the router's loop)."""


_CHECK_EVERY = 4096  # structural characters between deadline checks (~5 ms at the worst shape)


def _value_end(text: str, i: int, deadline: float | None = None) -> int:
    c = text[i : i + 1]
    if c == '"':
        return _string_end(text, i)
    if c in ("[", "{"):
        depth, n, steps = 0, len(text), 0
        while True:
            steps += 1
            if deadline is not None and steps % _CHECK_EVERY == 0 and time.monotonic() > deadline:
                raise OutOfTime()
            i = _PLAIN.match(text, i).end()  # type: ignore[union-attr]
            if i >= n:
                raise ValueError("unbalanced brackets")
            ch = text[i]
            if ch == '"':
                i = _string_end(text, i)
                continue
            depth += 1 if ch in "[{" else -1
            i += 1
            if depth == 0:
                return i
            if depth > MAX_DEPTH:
                raise BadBody("too_deep", f"body nests deeper than {MAX_DEPTH} levels")
    m = _SCALAR.match(text, i)
    if m is None:
        raise ValueError("expected a value")
    return m.end()


def _closes(text: str, i: int) -> bool:
    """Whether the top-level object ends at `i`; nothing but whitespace may follow it."""
    if text[i : i + 1] != "}":
        return False
    if _SPACE.match(text, i + 1).end() != len(text):  # type: ignore[union-attr]
        # A streaming decoder (Go's json.Decoder) reads the first value and ignores the rest: which
        # value a backend reads is then its reader's choice.
        raise BadBody("trailing_data", "data after the JSON object")
    return True


def _members(text: str, deadline: float | None = None, values: dict[str, Any] | None = None
             ) -> Iterator[tuple[str, int, int]]:
    """(key, start, end) of each top-level member's value in the JSON object `text`, in order,
    without decoding the values; OutOfTime past `deadline`. `values`: each value decoded into it
    instead, by the C decoder (a body `_decodable` at once)."""
    if deadline is not None and time.monotonic() > deadline:
        raise OutOfTime()  # it waited its turn past its request's deadline: nobody wants it now
    i = _SPACE.match(text, 0).end()  # type: ignore[union-attr]
    if text[i : i + 1] != "{":
        other = json.loads(text)  # not JSON at all (ValueError), or JSON of another kind
        raise BadBody("not_object", f"body is a JSON {type(other).__name__}, not an object")
    i = _SPACE.match(text, i + 1).end()  # type: ignore[union-attr]
    if _closes(text, i):
        return
    while True:
        if text[i : i + 1] != '"':
            raise ValueError("expected a key")
        key, i = _DECODER.raw_decode(text, i)
        i = _SPACE.match(text, i).end()  # type: ignore[union-attr]
        if text[i : i + 1] != ":":
            raise ValueError("expected ':'")
        start = _SPACE.match(text, i + 1).end()  # type: ignore[union-attr]
        if values is None:
            end = _value_end(text, start, deadline)
        else:
            values[key], end = _DECODER.raw_decode(text, start)
        yield key, start, end
        i = _SPACE.match(text, end).end()  # type: ignore[union-attr]
        if _closes(text, i):
            return
        if text[i : i + 1] != ",":
            raise ValueError("expected ',' or '}'")
        i = _SPACE.match(text, i + 1).end()  # type: ignore[union-attr]


# A body this small with this few arrays and objects is decoded whole at once: the C decoder costs
# less than finding where its values end in Python (a chat request's parse: 22 -> 16 us), and it
# cannot nest past MAX_DEPTH.
DECODE_AT_ONCE_BYTES = 16 * 1024


def _decodable(text: str) -> bool:
    return len(text) <= DECODE_AT_ONCE_BYTES and text.count("{") + text.count("[") <= MAX_DEPTH


def top_level(text: str, deadline: float | None = None, values: dict[str, Any] | None = None
              ) -> dict[str, tuple[int, int] | None]:
    """Key -> value span of every top-level member (_members); DuplicateKey on a repeated key,
    at the top level or, with `values`, anywhere. `values`: filled with the members' decoded values
    where the body is small enough to decode at once; left empty otherwise, or where a value is
    malformed (the scan then finds what the body is, as it does for a large one)."""
    if values is not None and _decodable(text):
        try:
            return _spans(_members(text, values=values))
        except DuplicateKey:
            raise
        except ValueError:
            values.clear()
    return _spans(_members(text, deadline=deadline))


def _spans(members: Iterator[tuple[str, int, int]]) -> dict[str, tuple[int, int] | None]:
    spans: dict[str, tuple[int, int] | None] = {}
    folded: set[str] = set()
    for key, start, end in members:
        if fold(key) in folded:
            raise DuplicateKey(key)
        folded.add(fold(key))
        spans[key] = (start, end)
    return spans


def duplicate_key(dup: DuplicateKey) -> BadBody:
    return BadBody("duplicate_key", f"key {str(dup)[:64]!r} appears twice in one object (keys compared "
                                    "case-insensitively, as some backends read them)")


def decode_value(text: str, start: int, end: int) -> Any:
    value, stop = _DECODER.raw_decode(text, start)
    if stop != end:
        raise ValueError("malformed value")
    return value


class LazyObject(MutableMapping):
    """A request body's top-level object whose member values are decoded when first read (the
    router reads only `model` and the prompt's members; a plugin may read any). A member that
    turns out malformed, or repeats a key inside, raises ValueError when read."""

    def __init__(self, text: str | bytes, spans: dict[str, tuple[int, int] | None],
                 values: dict[str, Any] | None = None):
        self._source = text  # bytes: decoded on the first read (spans index the decoded text)
        self._spans = spans
        self._values: dict[str, Any] = values if values is not None else {}

    def __getitem__(self, key: str) -> Any:
        if key not in self._values:
            span = self._spans[key]
            if isinstance(self._source, bytes):
                self._source = self._source.decode("utf-8")
            self._values[key] = decode_value(self._source, *span) if span else None
        return self._values[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._spans.setdefault(key, None)
        self._values[key] = value

    def __delitem__(self, key: str) -> None:
        del self._spans[key]
        self._values.pop(key, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._spans)

    def __len__(self) -> int:
        return len(self._spans)

    @property
    def spans(self) -> dict[str, tuple[int, int] | None]:
        """Where each top-level member's value sits in the decoded text (None: set, not parsed)."""
        return self._spans

    def decoded(self, key: str) -> bool:
        """Whether the member has been read (decoded, or set) already."""
        return key in self._values

    def byte_span(self, key: str) -> tuple[int, int] | None:
        """Where `key`'s value sits in the raw body's bytes; None when absent or set afterwards."""
        span = self._spans.get(key)
        if span is None:
            return None
        if isinstance(self._source, bytes):
            self._source = self._source.decode("utf-8")
        return byte_span(self._source, *span)


def byte_span(text: str, start: int, end: int) -> tuple[int, int]:
    # `model` comes first in practice, so encoding the text before it is cheap.
    b = len(text[:start].encode("utf-8"))
    return b, b + len(text[start:end].encode("utf-8"))


def scan_unread(raw: bytes, deadline: float | None = None) -> tuple[str | None, tuple[int, int] | None]:
    """The top-level `model` of a body too large to parse, and its byte span, from a scan of every
    top-level member (linear, nothing decoded but `model`): a key repeated anywhere at the top
    level raises BadBody duplicate_key, whatever the size, since backends that keep the last copy
    would read a model the router never saw. (None, None) when the body is not a JSON object."""
    try:
        text = utf8_text(raw)
        spans = top_level(text, deadline)
        span = spans.get("model")
        return _model_at(text, *span) if span is not None else (None, None)
    except DuplicateKey as dup:
        raise duplicate_key(dup) from None
    except BadBody as bad:
        if bad.kind in AMBIGUOUS:
            raise
    except (ValueError, RecursionError):
        pass
    return None, None


def _model_at(text: str, start: int, end: int) -> tuple[str | None, tuple[int, int] | None]:
    value = decode_value(text, start, end)
    return (value, byte_span(text, start, end)) if isinstance(value, str) else (None, None)


def structure(raw: bytes) -> int:
    """How many structural characters a body holds: the scan and decode cost per byte is set by
    these (~1-3 us each), not by its length. Counted at memchr speed (~20 us per 256 KiB)."""
    return raw.count(b'"') + raw.count(b"{") + raw.count(b"[")


def with_members(raw: bytes, members: dict[str, tuple[tuple[int, int] | None, Any]]) -> bytes:
    """`raw` with each top-level member's value replaced where its byte span is given, the others
    added first; every other byte as the client sent it."""
    out, last = [], len(raw)
    given = [(span, value) for span, value in members.values() if span is not None]
    for span, value in sorted(given, key=lambda m: -m[0][0]):
        out.append(raw[span[1]:last])
        out.append(member_bytes(value))
        last = span[0]
    out.append(raw[:last])
    raw = b"".join(reversed(out))
    added = b",".join(json.dumps(k).encode() + b":" + member_bytes(v)
                      for k, (span, v) in members.items() if span is None)
    if not added:
        return raw
    i = raw.index(b"{") + 1
    rest = raw[i:].lstrip(b" \t\n\r")
    sep = b"" if rest.startswith(b"}") else b","
    return raw[:i] + added + sep + raw[i:]


def value_at(raw: bytes, members: dict[str, tuple[tuple[int, int] | None, Any]], key: str,
             span: tuple[int, int] | None) -> int:
    """Where the value of top-level member `key` starts in `with_members(raw, members)`: `span`, its
    value's span in `raw` (None: `members` adds it)."""
    added = [(k, v) for k, (s, v) in members.items() if s is None]
    pos = raw.index(b"{") + 1
    if span is None:
        for k, v in added:
            head = len(json.dumps(k).encode()) + 1  # "key":
            if k == key:
                return pos + head
            pos += head + len(member_bytes(v)) + 1  # and the comma after it
        raise KeyError(key)
    start = span[0]
    for s, v in members.values():
        if s is not None and s[0] < span[0]:
            start += len(member_bytes(v)) - (s[1] - s[0])
    if added:  # inserted first, with a comma: the body has members (this one)
        start += sum(len(json.dumps(k).encode()) + 1 + len(member_bytes(v)) for k, v in added) + len(added)
    return start
