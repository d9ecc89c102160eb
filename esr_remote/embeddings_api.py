"""A blocking client of the OpenAI embeddings API (POST {url}/embeddings, `input` a list), keeping
one HTTP/1.1 keep-alive connection per calling thread."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import threading
import time
import urllib.parse
from typing import Sequence

import numpy as np

# What a connection the server closed while it sat idle in our pool looks like on its next use:
# the request is sent again once, on a new connection.
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


# The most an answer may hold: a float-JSON row of a 4,096-dimension model is ~80 KB.
ANSWER_BASE_BYTES = 1024 * 1024
ANSWER_BYTES_PER_INPUT = 256 * 1024


class EngineStatus(Exception):
    """The engine answered with an HTTP status other than 200. Its body is not kept: an engine's
    error message may echo the prompt, which must not reach the log."""

    def __init__(self, status: int, body: bytes):
        super().__init__(f"HTTP {status} ({len(body)} bytes of body)")
        self.status = status


class EmbeddingsAPI:
    """Thread-safe: each thread uses a connection of its own. Raises EngineStatus, TimeoutError,
    OSError or http.client.HTTPException, and ValueError for an answer that is not embeddings."""

    def __init__(self, url: str, model: str, api_key: str | None = None, encoding: str = "base64"):
        parts = urllib.parse.urlsplit(url)
        self.url = url
        self.model = model
        self.encoding = encoding  # "base64": a quarter of the bytes, no float parsing; "float" where refused
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname or "", parts.port  # the config requires a host
        self._path = parts.path.rstrip("/") + "/embeddings"
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._local = threading.local()

    def __repr__(self) -> str:  # never the headers: they hold the key
        return f"EmbeddingsAPI(url={self.url!r}, model={self.model!r})"

    def embed(self, texts: Sequence[str], timeout: float) -> np.ndarray:
        """Unit-length float32 rows, one per text, in order. The whole call (connect, send, every
        read, a retry on a stale connection) ends within `timeout`: an engine that drips its answer
        a byte at a time gets TimeoutError, not a lane held forever."""
        body = json.dumps({"model": self.model, "input": list(texts), "encoding_format": self.encoding},
                          ensure_ascii=False).encode("utf-8")
        limit = ANSWER_BASE_BYTES + ANSWER_BYTES_PER_INPUT * len(texts)
        deadline = time.monotonic() + timeout
        reused = getattr(self._local, "conn", None) is not None
        try:
            status, data = self._post(body, deadline, limit)
        except _STALE:
            if not reused:
                raise
            status, data = self._post(body, deadline, limit)
        if status != 200:
            raise EngineStatus(status, data)
        return _vectors(data, len(texts))

    def close(self) -> None:
        """This thread's connection."""
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def _post(self, body: bytes, deadline: float, limit: int) -> tuple[int, bytes]:
        timeout = deadline - time.monotonic()
        if timeout <= 0:
            raise TimeoutError("no time left for the call")
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = self._local.conn = cls(self._host, self._port, timeout=timeout)
        conn.timeout = timeout  # for a new connection's connect()
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        # Per-operation socket timeouts do not bound the call: a watchdog ends it at the deadline.
        watchdog = threading.Timer(timeout, _abort, (conn,))
        watchdog.daemon = True
        watchdog.start()
        try:
            conn.request("POST", self._path, body, self._headers)
            resp = conn.getresponse()
            data = resp.read(limit + 1)
            if time.monotonic() >= deadline:  # the watchdog cut it: what was read is partial
                raise TimeoutError("the call outlived its deadline")
            if len(data) > limit:
                raise ValueError(f"answer larger than {limit} bytes")
        except BaseException as exc:
            self.close()  # half a request or answer on it: the connection is of no further use
            if time.monotonic() >= deadline and not isinstance(exc, TimeoutError):
                raise TimeoutError("the call outlived its deadline") from None
            raise
        finally:
            watchdog.cancel()
        if resp.will_close or not resp.isclosed():
            self.close()
        return resp.status, data


def _abort(conn: http.client.HTTPConnection) -> None:
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)  # the blocked read returns at once
        except OSError:
            pass


def _vectors(data: bytes, n: int) -> np.ndarray:
    try:
        rows = sorted(json.loads(data)["data"], key=lambda d: d["index"])
        if len(rows) != n:
            raise ValueError(f"{len(rows)} embeddings for {n} inputs")
        out = np.stack([_row(r["embedding"]) for r in rows])
    except (KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"not an embeddings answer: {type(exc).__name__} {exc}") from None
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.maximum(norms, 1e-12)  # routes compare by cosine: every path answers unit vectors


def _row(embedding) -> np.ndarray:
    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding), dtype="<f4").astype(np.float32)
    return np.asarray(embedding, dtype=np.float32)
