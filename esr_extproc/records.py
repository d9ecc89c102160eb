"""Decision records: one JSON line per decision, sampled and rate-limited, to a file or stdout, for
`semantic-router replay` and for whoever asks why a request went where it did.

A record holds what was decided and why (route, reason, score, confidence, tier, model), the cache's
part, the router's time, the tenant as a hash and the W3C trace id, and what rules read (token
estimate, tools, images). The texts routed on are kept only with `records.prompts: true`: they are
the users' words, personal data under most regimes, capped at `prompt_max_chars` each. Lines are
written by a thread of their own: a slow disk costs records (counted), never a request's time."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import queue
import random
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, BinaryIO

from esr_extproc.metrics import RECORDS as WRITTEN
from esr_settings import require
from filters.context import RequestContext
from router.classifier import Decision

log = logging.getLogger(__name__)

QUEUE = 4096  # records waiting for the writer; past it, dropped
# Whatever a client sent (a model name, a path, a text) is cut to this many characters in a record,
# and a line to LINE_MAX bytes: one request cannot make a record that costs the others theirs.
FIELD_MAX = 256
LINE_MAX = 256 * 1024
LOOK_S = 1.0  # how often a writer looks at its file: moved away, too large, too old


@dataclass(frozen=True)
class RecordsConfig:
    """The `records:` section."""

    enabled: bool = False
    path: str = "-"  # a JSONL file, appended to ("{host}" in it: this host's name); "-": standard output
    sample_ratio: float = 1.0  # the share of decisions recorded
    max_per_s: float = 1000.0  # at most this many a second (a token bucket a second deep)
    prompts: bool = False  # also the texts routed on: personal data, opt in
    prompt_max_chars: int = 4096  # each text cut to this many characters
    # Retention: the file is moved to `<path>.1` (the one before it deleted) once it holds this many
    # bytes, or its first record is this old; 0: never. At most two files' worth is ever kept.
    max_bytes: int = 0
    max_age_s: float = 0.0

    def __post_init__(self):
        require(self.max_bytes >= 0, "max_bytes", "must be 0 (no limit) or a positive number of bytes")
        require(self.max_age_s >= 0, "max_age_s", "must be 0 (no limit) or a positive number of seconds")
        require(self.path != "-" or not (self.max_bytes or self.max_age_s), "max_bytes",
                "a size or age bound needs records.path to name a file")
        require(0.0 <= self.sample_ratio <= 1.0, "sample_ratio", "must be between 0 and 1")
        require(self.max_per_s > 0, "max_per_s", "must be positive")
        require(self.prompt_max_chars >= 1, "prompt_max_chars", "must be at least 1")
        require(bool(self.path), "path", "must name a file, or - for standard output")


def decision_record(ctx: RequestContext, decision: Decision, tenant: str, cache: str | None,
                    seconds: float, parts: dict[str, float], traced: str | None = None) -> dict[str, Any]:
    """What a record says of one decided request (the texts are added by the recorder, if asked).
    `traced`: the trace id of the router's span where it (or Envoy, its parent) sampled the request;
    a client's own traceparent is not believed."""
    out: dict[str, Any] = {
        "trace_id": traced, "tenant": tenant, "path": ctx.path,
        "requested_model": ctx.requested_model, "route": decision.route, "model": decision.model,
        "reason": decision.reason, "score": round(decision.score, 4), "confidence": round(decision.confidence, 4),
        "tier": decision.tier or None, "cache": cache, "ms": round(seconds * 1000, 3),
        "ms_parts": {name: round(s * 1000, 3) for name, s in parts.items()},
        "facts": {"prompt_tokens": ctx.facts.prompt_tokens, "tools": ctx.facts.has_tools,
                  "images": ctx.facts.has_images, "max_tokens": ctx.facts.max_tokens,
                  "structured": ctx.facts.structured, "stream": ctx.facts.stream},
    }
    if decision.chain:
        out["chain"] = list(decision.chain)
    if decision.skipped:
        out["skipped"] = list(decision.skipped)
    if decision.predicted_quality is not None:
        out["predicted_quality"], out["price"] = round(decision.predicted_quality, 4), decision.price
    if decision.selection_id is not None:
        out["selection_id"] = decision.selection_id
    if ctx.unread is not None:
        out["unread"] = ctx.unread
    if ctx.immediate is not None:
        out["blocked"] = ctx.immediate.status
    return out


def score_record(key: str, route: str, model: str, selected: str, score: float) -> dict[str, Any]:
    """A record of a score selection feedback accepted (router/feedback.py): `key` is the signed
    selection id its request's record carries, so `select-fit --records` can join the two."""
    return {"kind": "score", "selection_id": key, "route": route, "model": model, "selected": selected,
            "score": score}


class DecisionRecorder:
    def __init__(self, config: RecordsConfig, draw=random.random, look_s: float = LOOK_S):
        self.config = config
        # `{host}`: this host's name (a pod's), so the replicas sharing a volume write a file each.
        self._path = config.path.replace("{host}", socket.gethostname())
        self._look_s = look_s
        self._random = draw
        self._tokens = config.max_per_s
        self._refilled = time.monotonic()
        self._queue: queue.Queue[dict | None] = queue.Queue(QUEUE)
        self._out: BinaryIO | None = None
        self._since: float | None = None  # the open file's first record's time
        self._next_look = 0.0
        self._thread = threading.Thread(target=self._write, name="decision-records", daemon=True)
        self._thread.start()

    def wants(self) -> bool:
        """Whether the next decision is recorded: sampled, then within the rate."""
        if self.config.sample_ratio < 1.0 and self._random() >= self.config.sample_ratio:
            return False
        now = time.monotonic()
        self._tokens = min(self.config.max_per_s, self._tokens + (now - self._refilled) * self.config.max_per_s)
        self._refilled = now
        if self._tokens < 1.0:
            WRITTEN.labels("rate_limited").inc()
            return False
        self._tokens -= 1.0
        return True

    def record_decision(self, ctx: RequestContext, decision: Decision, tenant: str, cache: str | None,
                        times: tuple[float, float, float], traced: str | None = None) -> None:
        """Queues the record of one decided request; `times`: perf_counter() when it started, when
        its body was read and when the chain had decided (the rest is the cache's)."""
        started, read_at, decided_at = times
        now = time.perf_counter()
        parts = {"read": read_at - started, "filters": decided_at - read_at, "cache": now - decided_at}
        self.record(decision_record(ctx, decision, tenant, cache, now - started, parts, traced), ctx.turns)

    def record(self, fields: dict[str, Any], texts: tuple[str, ...] = ()) -> None:
        """Queues one record (`texts` kept only where prompts are asked for); never blocks."""
        line = {"time": round(time.time(), 6), **fields}
        if self.config.prompts and texts:
            line["texts"] = [t[: self.config.prompt_max_chars] for t in texts]
        try:
            self._queue.put_nowait(line)
        except queue.Full:
            WRITTEN.labels("queue_full").inc()

    def close(self, timeout: float = 5.0) -> None:
        """Writes what is queued, then stops."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)

    def _write(self) -> None:
        while True:
            try:
                # An idle writer still looks at its file: a bound by age holds without traffic.
                line = self._queue.get(timeout=max(self._look_s, 0.05))
            except queue.Empty:
                self._keep_bounds()
                continue
            if line is None:
                break
            try:
                # One write per line, unbuffered, appending: the processes of a pool share one file
                # without a line of one cutting into another's.
                self._open().write(encode_line(line))
                WRITTEN.labels("written").inc()
                if self._since is None:
                    self._since = line["time"]
            except Exception as exc:  # one record lost, never the writer
                WRITTEN.labels("error").inc()
                log.warning("decision record not written", extra={"error": type(exc).__name__})
                self._drop()  # the next record opens the file afresh (a stale handle on NFS, say)
        self._drop()

    def _open(self) -> BinaryIO:
        self._keep_bounds()
        if self._out is None:
            if self.config.path == "-":
                self._out = sys.stdout.buffer
            else:
                # Owner and group only: the texts are personal data.
                self._out = os.fdopen(os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640), "ab",
                                      buffering=0)
                self._since = _first_time(self._path)
                self._next_look = time.monotonic() + self._look_s
        return self._out

    def _keep_bounds(self) -> None:
        if self._out is not None and self.config.path != "-" and time.monotonic() >= self._next_look:
            try:
                self._look()
            except OSError as exc:
                log.warning("decision records not rotated", extra={"error": type(exc).__name__})
                self._drop()

    def _look(self) -> None:
        """Reopens the file when another process (or the refit job) moved it away, and moves it to
        `.1` itself when it is past its size or age (under a lock the processes of a pool share, so
        two never move one file twice): `mv` is how a file is taken for a refit, and every process
        writes to the new file within LOOK_S. A `.1` older than `max_age_s` is deleted."""
        assert self._out is not None
        self._next_look = time.monotonic() + self._look_s
        try:
            mine = os.fstat(self._out.fileno())
            there = os.stat(self._path)
        except OSError:  # moved away, or a handle gone stale: a new file
            self._drop()
            return
        if (there.st_ino, there.st_dev) != (mine.st_ino, mine.st_dev):
            self._drop()
            return
        bound = self.config.max_age_s
        old = bound and self._since is not None and time.time() - self._since >= bound
        if (self.config.max_bytes and there.st_size >= self.config.max_bytes) or old:
            with open(self._path + ".lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    now = os.stat(self._path)
                except FileNotFoundError:
                    now = None
                if now is not None and (now.st_ino, now.st_dev) == (mine.st_ino, mine.st_dev):
                    os.replace(self._path, self._path + ".1")
                    WRITTEN.labels("rotated").inc()
            self._drop()
        elif bound:
            try:
                if time.time() - os.stat(self._path + ".1").st_mtime >= bound:
                    os.unlink(self._path + ".1")
            except FileNotFoundError:
                pass

    def _drop(self) -> None:
        """Closes the file; the next record opens the one at the path."""
        if self._out is not None and self._out is not sys.stdout.buffer:
            try:
                self._out.close()
            except OSError:
                pass
        self._out = None


def _first_time(path: str) -> float | None:
    """The time of a file's first record (None: empty, or not a record): what its age is counted from."""
    try:
        with open(path, "rb") as f:
            first = f.readline(LINE_MAX + 1)
        return float(json.loads(first)["time"]) if first else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _bounded(value: Any, texts: bool = False) -> Any:
    """`value` with every string a client may have sent cut to FIELD_MAX characters (the texts are cut
    by the recorder, to prompt_max_chars)."""
    if isinstance(value, str):
        return value if texts or len(value) <= FIELD_MAX else value[:FIELD_MAX]
    if isinstance(value, dict):
        return {k[:FIELD_MAX]: _bounded(v, texts or k == "texts") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_bounded(v, texts) for v in value]
    return value


def encode_line(record: dict[str, Any]) -> bytes:
    """One record as a JSON line of at most LINE_MAX bytes. Characters UTF-8 cannot carry (a lone
    surrogate a client escaped into its JSON) are written as JSON escapes, which read back as sent;
    control characters are escaped by JSON itself. Over the limit, the texts go first (`cut`)."""
    def encode(line: dict[str, Any]) -> bytes:
        return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "backslashreplace") + b"\n"

    line = _bounded(record)
    data = encode(line)
    if len(data) > LINE_MAX and "texts" in line:
        data = encode({**{k: v for k, v in line.items() if k != "texts"}, "cut": "texts"})
    return data
