"""The `cache:` section."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from esr_settings import require

_HEADER = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")


@dataclass(frozen=True)
class CacheConfig:
    """Answers of chat completions kept and replayed by the gateway, keyed exactly (keys.py)."""

    enabled: bool = False
    # memory: in this process, bounded, LRU. redis: shared by every router that names the same
    # redis_url (entries expire after ttl_s; Redis's own maxmemory policy bounds it).
    backend: Literal["memory", "redis"] = "memory"
    redis_url: str | None = None  # redis://host:6379/0
    redis_timeout_ms: float = 50.0  # the longest a lookup or a write may wait for Redis
    max_bytes: int = 64 * 1024 * 1024  # every entry's answer together
    max_entry_bytes: int = 1024 * 1024  # a larger answer is passed on, not kept
    ttl_s: float = 3600.0
    # Whose answers a request may see: the value of this request header, hashed. None: Authorization
    # (each API key its own tenant); a request without it shares the anonymous tenant.
    tenant_header: str | None = None
    # Semantic matching of the last user turn (semantic.py), on these routes only; none: exact only.
    semantic_routes: tuple[str, ...] = ()
    # The semantic index's vectors and keys together (counted in cache_bytes beside the answers).
    semantic_index_bytes: int = 16 * 1024 * 1024
    semantic_threshold: float = 0.95  # cosine of the two turns' embeddings (docs/response-cache.md: measured)
    # Route -> its own threshold (written by `fit` on data with intents); a route named here needs
    # no entry in semantic_routes.
    semantic_thresholds: dict = field(default_factory=dict)

    # What a reload takes from the file, with the routes these name (esr_app/reload.py); the rest
    # (the store, its sizes, the tenant header the rendered Envoy config strips) needs a restart.
    RELOADED: ClassVar[tuple[str, ...]] = ("semantic_routes", "semantic_threshold", "semantic_thresholds")

    def reloaded(self, from_file: CacheConfig) -> CacheConfig:
        """This running section with the file's matching policy."""
        return dataclasses.replace(self, **{name: getattr(from_file, name) for name in self.RELOADED})

    @property
    def semantic(self) -> frozenset[str]:
        """The routes with semantic matching."""
        return frozenset(self.semantic_routes) | frozenset(self.semantic_thresholds)

    def threshold_of(self, route: str) -> float:
        return float(self.semantic_thresholds.get(route, self.semantic_threshold))

    def __post_init__(self):
        require(self.max_bytes >= 1024, "max_bytes", "must be at least 1024")
        require(1024 <= self.max_entry_bytes <= self.max_bytes, "max_entry_bytes", "must be between 1024 and max_bytes")
        require(self.ttl_s > 0, "ttl_s", "must be positive")
        require(self.semantic_index_bytes >= 64 * 1024, "semantic_index_bytes", "must be at least 65536")
        require(self.backend != "redis" or (self.redis_url or "").startswith(("redis://", "rediss://", "unix://")),
                "redis_url", "backend redis needs a redis://, rediss:// or unix:// URL")
        require(self.redis_timeout_ms > 0, "redis_timeout_ms", "must be positive")
        require(-1.0 <= self.semantic_threshold <= 1.0, "semantic_threshold", "must be between -1 and 1")
        for route, value in self.semantic_thresholds.items():
            require(isinstance(value, (int, float)) and not isinstance(value, bool) and -1.0 <= value <= 1.0,
                    f"semantic_thresholds.{route}", "must be a number between -1 and 1")
        require(self.tenant_header is None or bool(_HEADER.match(self.tenant_header)), "tenant_header",
                "must be a lower-case header name")
