"""A blocking client of the OpenAI embeddings API (POST {url}/embeddings, `input` a list), keeping
one HTTP/1.1 keep-alive connection per calling thread."""

from __future__ import annotations

import base64
import http.client
import json
import threading
import urllib.parse
from typing import Sequence

import numpy as np

# What a connection the server closed while it sat idle in our pool looks like on its next use:
# the request is sent again once, on a new connection.
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


class EngineStatus(Exception):
    """The engine answered with an HTTP status other than 200."""

    def __init__(self, status: int, body: bytes):
        super().__init__(f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}")
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
        self._host, self._port = parts.hostname, parts.port
        self._path = parts.path.rstrip("/") + "/embeddings"
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._local = threading.local()

    def __repr__(self) -> str:  # never the headers: they hold the key
        return f"EmbeddingsAPI(url={self.url!r}, model={self.model!r})"

    def embed(self, texts: Sequence[str], timeout: float) -> np.ndarray:
        """Unit-length float32 rows, one per text, in order."""
        body = json.dumps({"model": self.model, "input": list(texts), "encoding_format": self.encoding},
                          ensure_ascii=False).encode("utf-8")
        reused = getattr(self._local, "conn", None) is not None
        try:
            status, data = self._post(body, timeout)
        except _STALE:
            if not reused:
                raise
            status, data = self._post(body, timeout)
        if status != 200:
            raise EngineStatus(status, data)
        return _vectors(data, len(texts))

    def close(self) -> None:
        """This thread's connection."""
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def _post(self, body: bytes, timeout: float) -> tuple[int, bytes]:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = self._local.conn = cls(self._host, self._port, timeout=timeout)
        conn.timeout = timeout  # for a new connection's connect()
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        try:
            conn.request("POST", self._path, body, self._headers)
            resp = conn.getresponse()
            data = resp.read()
        except BaseException:
            self.close()  # half a request or answer on it: the connection is of no further use
            raise
        if resp.will_close:
            self.close()
        return resp.status, data


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
