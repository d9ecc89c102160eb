"""One HTTP request's state across its ext_proc messages: what its headers said, its body as it
arrives, how Envoy sends it, and its exchange with the response cache."""

from __future__ import annotations

import functools
import re
import time
import urllib.parse

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from esr_cache.exchange import CacheExchange
from esr_extproc import replies
from esr_extproc.headers import LLM_PATHS


@functools.lru_cache(maxsize=256)  # a gateway sees a handful of paths; any other only misses
def canonical_path(path: str) -> str:
    """The path as the most lenient backend reads it, for deciding whether it is an LLM call.

    Envoy has already normalised it (dot segments, merged and unescaped slashes, unreserved
    escapes: `normalize_path` in the rendered config); backends may still decode other escapes,
    ignore `;params` and a trailing slash, or match case-insensitively, so the router does too.
    """
    path = urllib.parse.unquote(path.split("?", 1)[0]).split(";", 1)[0]
    return re.sub("/+", "/", path).rstrip("/").lower()


class RequestStream:
    __slots__ = ("started", "path", "method", "headers", "body", "body_bytes", "encoding", "body_mode", "admitted", "holders",
                 "held_headers", "unbuffered", "cache", "trace_metadata", "outcome",
                 "feedback_path")

    def __init__(self) -> None:
        # The request's budget runs from the first message the router sees (earlier where Envoy's
        # stamp says when it sent it on: the service's _on_headers), not from the body: time spent
        # waiting for Envoy to buffer the body or for this loop to get to it counts.
        self.started = time.monotonic()
        self.path = ""
        self.method = ""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []  # chunks; BUFFERED mode sends one, joined without a copy
        self.body_bytes = 0
        self.encoding: str | None = None  # the body's content-encoding, one encodings.inflate reads
        self.body_mode = replies.BUFFERED  # as Envoy's first message says (protocol_config)
        self.admitted = False  # holds a slot (the service's admission) until its body is answered
        self.holders: tuple[str, ...] | None = None  # whom its slot counts against; None: not admitted here
        self.held_headers: pb.ProcessingResponse | None = None  # full duplex: the answer the body completes
        self.unbuffered = False  # streamed: the body came on in chunks, the override refused
        self.cache: CacheExchange | None = None  # None: its answer is neither looked up nor kept
        self.trace_metadata: tuple = ()  # the ext_proc call's metadata, when tracing (its traceparent)
        self.outcome: tuple | None = None  # (decision, requested model, cache result), once decided
        self.feedback_path: str | None = None  # where selection feedback is on: the path scores are posted to

    @property
    def duplex(self) -> bool:
        """FULL_DUPLEX_STREAMED: the headers answer is held until the body is whole, then sent with
        the route before the body."""
        return self.body_mode == replies.FULL_DUPLEX

    @property
    def streamed(self) -> bool:
        """STREAMED: an LLM call's body is asked for whole (mode_override); a gateway that refuses
        overrides streams it on anyway, too late to route."""
        return self.body_mode == replies.STREAMED

    @property
    def llm_call(self) -> bool:
        """A call the router reads the body of: an LLM API call, or a score for selection feedback."""
        return self.method == "POST" and (self.path.endswith(LLM_PATHS) or self.path == self.feedback_path)

    @property
    def feedback_call(self) -> bool:
        return self.method == "POST" and self.path == self.feedback_path

    def from_attributes(self, request: pb.ProcessingRequest) -> None:
        """Path and method from the attributes Envoy attaches to the first message it sends
        (`request_attributes: [request.path, request.method]`) when it sends no headers message."""
        attrs = request.attributes.get("envoy.filters.http.ext_proc")
        if attrs is not None:
            self.method = attrs.fields["request.method"].string_value if "request.method" in attrs.fields else ""
            if "request.path" in attrs.fields:
                self.path = canonical_path(attrs.fields["request.path"].string_value)
