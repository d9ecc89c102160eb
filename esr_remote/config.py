"""The `encoder.remote` section: an embedding engine to send batches to."""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

from esr_settings import require

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class RemoteEncoderConfig:
    """An embedding engine serving the OpenAI embeddings API (Infinity, TEI, vLLM, OpenAI itself):
    the batcher sends each batch as one POST {url}/embeddings instead of running a model here."""

    url: str  # base URL: http://host:7997 (Infinity), http://host:8080/v1 (TEI), http://host:8000/v1 (vLLM)
    model: str  # the engine's served model name
    api_key_env: str | None = None  # the environment variable holding the API key (never the key itself)
    timeout_ms: float = 1000.0  # longest one call may take; it also ends at its requests' deadline
    max_batch: int = 64  # inputs per call
    max_in_flight: int = 4  # calls at once: the engine batches again on its side
    # An API key over plain http:// can be read on the way: refused unless this says the network
    # between them is trusted (a sidecar on loopback, a mesh that encrypts).
    insecure_http: bool = False

    def __post_init__(self):
        parts = urllib.parse.urlsplit(self.url)
        require(parts.scheme in ("http", "https") and bool(parts.hostname), "url",
                 f"must be an http:// or https:// base URL, got {self.url!r}")
        require(parts.username is None and parts.password is None, "url",
                 "must not carry credentials: name an environment variable in api_key_env")
        require(not parts.query and not parts.fragment, "url", "must have no query or fragment")
        require(self.api_key_env is None or bool(_ENV_NAME.match(self.api_key_env)), "api_key_env",
                 f"must be an environment variable name, got {self.api_key_env!r}")
        require(self.timeout_ms > 0, "timeout_ms", "must be positive")
        require(1 <= self.max_batch <= 2048, "max_batch", "must be between 1 and 2048")
        require(1 <= self.max_in_flight <= 64, "max_in_flight", "must be between 1 and 64")
        require(parts.scheme != "http" or self.api_key_env is None or self.insecure_http, "url",
                 "http:// would send the API key in clear: use https://, or set insecure_http: true")
