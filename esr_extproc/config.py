"""The ext_proc server's sections: the gRPC server (`server`) and the Envoy in front of it
(`envoy`, `backends`) that `envoy-config` renders."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from esr_settings import header_safe, require

_HEADER = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")


@dataclass(frozen=True)
class ServerConfig:
    grpc_host: str = "127.0.0.1"
    grpc_port: int = 50051
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9090
    deadline_ms: float = 500.0  # a request still undecided by then gets the default route
    shutdown_grace_s: float = 10.0  # after the delay: in-flight streams get this long to finish
    shutdown_delay_s: float = 1.0  # on SIGTERM: report NOT_SERVING but keep serving this long first
    watch_config_s: float = 2.0  # poll the config file for changes this often; 0 turns it off (SIGHUP still works)
    # ext_proc front-end processes sharing grpc_port (SO_REUSEPORT), fed by one model process.
    # 1: one process does everything. auto: half the CPUs the router may use (the rest are for
    # Envoy and the model process's tokenizer and GPU feeding).
    workers: int | Literal["auto"] = 1
    # The front end's event loop: uvloop or asyncio's own (no difference measured here:
    # docs/benchmarks.md, "Model runtime"); auto: uvloop where installed (the runtime lock has it), else asyncio.
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    # grpc.health.v1 on a port of its own as well (the Inference Extension's charts: ext_proc on
    # 9004, health on 9005); None: health only on grpc_port, beside ext_proc.
    health_port: int | None = None
    # The standard headers of the Gateway API Inference Extension, set beside the router's own: the
    # routed backend model, and for a model listed in base_models (a LoRA adapter) its base model.
    # HTTPRoutes match them to pick an InferencePool or Service. None: not set.
    gateway_model_header: str | None = "x-gateway-model-name"
    gateway_base_model_header: str | None = "x-gateway-base-model-name"
    base_models: dict = field(default_factory=dict)  # backend model -> the base model it adapts
    # LLM calls a process decides at once (whole body in hand, not yet answered): past it, a new one
    # is shed at its headers (reason fallback_overload, skip the body), before it costs the event loop
    # a parse, so every message is still answered before Envoy's message timeout
    # (docs/static-tier.md#overload). A shed request takes envoy.undecided's policy; where that
    # refuses, the router answers 429 with retry-after instead. An upload still arriving holds no
    # slot. 0: never shed. Buffered body mode only.
    max_in_flight: int = 128
    # The share of max_in_flight one client (its address, as Envoy saw it) or one tenant (its
    # credential: cache.tenant_header, else authorization) may hold; past it, that client's new calls
    # are shed (fallback_client_share) and everyone else's still decided. 1: no share.
    client_share: float = 0.5
    # Also shed at the headers a request that waited this long between Envoy sending it on and the
    # router reading it (the rendered config stamps it: headers.SENT_AT): its body message would
    # wait as long again, and Envoy's message timeout (message_timeout_ms) would pass it on
    # unexamined. None: resolved by shed_wait_s, by whether a static tier serves. 0: never.
    shed_wait_ms: float | None = None

    @property
    def gateway_headers(self) -> tuple[str, ...]:
        """The standard headers this router sets (and so strips from clients)."""
        return tuple(h for h in (self.gateway_model_header, self.gateway_base_model_header) if h)

    def standard_headers(self, model: str) -> dict[str, str]:
        """The Inference Extension's headers for a request routed to `model`."""
        out = {self.gateway_model_header: model} if self.gateway_model_header else {}
        base = self.base_models.get(model)
        if base and self.gateway_base_model_header:
            out[self.gateway_base_model_header] = base
        return out

    def __post_init__(self):
        require(self.workers == "auto" or 1 <= self.workers <= 64, "workers", "must be auto or between 1 and 64")
        for name in ("gateway_model_header", "gateway_base_model_header"):
            value = getattr(self, name)
            require(value is None or bool(_HEADER.match(value)), name, "must be a lower-case header name")
        require(self.health_port is None or 1 <= self.health_port <= 65535, "health_port", "must be a port number")
        require(self.max_in_flight >= 0, "max_in_flight", "must not be negative (0: never shed)")
        require(0.0 < self.client_share <= 1.0, "client_share", "must be above 0 and at most 1")
        require(self.shed_wait_ms is None or self.shed_wait_ms >= 0, "shed_wait_ms",
                "must not be negative (0: never shed)")
        for model, base in self.base_models.items():
            require(isinstance(model, str) and isinstance(base, str) and bool(base), f"base_models.{model}",
                    "must name a base model")
        require(self.event_loop in ("auto", "asyncio", "uvloop"), "event_loop",
                 f"must be auto, asyncio or uvloop, got {self.event_loop!r}")
        for name in ("grpc_port", "metrics_port"):
            require(0 <= getattr(self, name) <= 65535, name, "must be a port number (0 picks a free one)")
        require(self.deadline_ms > 0, "deadline_ms", "must be positive")
        require(self.shutdown_grace_s >= 0, "shutdown_grace_s", "must not be negative")
        require(self.shutdown_delay_s >= 0, "shutdown_delay_s", "must not be negative")
        require(self.watch_config_s >= 0, "watch_config_s", "must not be negative")

    def shed_wait_s(self, static_tier: bool) -> float:
        """shed_wait_ms resolved, in seconds (0: never). Unset, it depends on who can still route a
        late request (docs/static-tier.md#overload). With a static tier, 55% of Envoy's message
        timeout (550 ms at the default deadline): the tier decides what it is sure of even past the
        deadline, so a late request is worth reading, but one read later is answered after the
        p99 the cascade keeps (a later wait raised the p99 at the same goodput). Without one, 70%
        of the deadline (350 ms): a request read later has too little of its budget left for the
        encoder, and would cost a parse only to fall back to the default route, where a shed one
        goes too (a later wait routed less at c512, an earlier one shed more and routed less). The
        waits measured: docs/notes/static-tier-history.md, "overload"."""
        if self.shed_wait_ms is not None:
            return self.shed_wait_ms / 1000.0
        return (0.55 * self.message_timeout_ms if static_tier else 0.7 * self.deadline_ms) / 1000.0

    @property
    def message_timeout_ms(self) -> int:
        """Envoy's wait for each answer in the rendered config: the deadline plus headroom for gRPC and
        Python, so the router's own fallback answers first and Envoy's timeout (failure_mode_allow)
        is only the backstop for a stuck router."""
        return int(self.deadline_ms + max(250.0, self.deadline_ms))


@dataclass(frozen=True)
class BackendConfig:
    """Where Envoy sends a backend model's traffic (used by `semantic-router envoy-config`)."""

    model: str
    address: str  # an IP (static cluster) or a DNS name (strict DNS cluster)
    port: int
    tls: bool = False
    sni: str | None = None  # TLS server name; defaults to the address
    # CA bundle the backend's certificate must chain to; None: envoy.ca_bundle (the system's).
    ca_file: str | None = None

    def __post_init__(self):
        header_safe(self.model, "model")
        require(self.ca_file is None or self.tls, "ca_file", "needs tls: true")
        require(1 <= self.port <= 65535, "port", "must be a port number")


@dataclass(frozen=True)
class EnvoyConfig:
    """The gateway side of the deployment, for `semantic-router envoy-config`."""

    listen_address: str = "127.0.0.1"
    listen_port: int = 8080
    admin_address: str = "127.0.0.1"
    admin_port: int = 9901
    router_address: str = "127.0.0.1"  # where Envoy reaches server.grpc_port
    max_request_bytes: int = 8 * 1024 * 1024  # Envoy's buffer for one request; above it: 413
    upstream_timeout_s: float = 300.0  # LLM responses stream for a long time
    # Envoy's limit on request headers, also after the router's mutation: the router refuses
    # (431) an LLM call that leaves it no room for its own headers, rather than let Envoy 500.
    max_request_headers: int = 100
    # A client must have sent its whole request within this (a stalled upload holds up to
    # max_request_bytes of Envoy's memory until then).
    request_timeout_s: float = 60.0
    # Envoy's heap bound for the overload manager: it resets the streams holding the most buffer
    # from 85% and stops taking requests at 95%. Keep it under the Envoy container's memory limit.
    max_heap_bytes: int = 384 * 1024 * 1024
    # Proxies in front of Envoy that append to x-forwarded-for and are trusted to: 0 at the edge,
    # where the client's own x-forwarded-for decides nothing (use_remote_address).
    trusted_hops: int = 0
    # Path prefixes (besides the LLM API paths) forwarded, unrouted, to the default backend;
    # every other path gets a 404 from the gateway.
    passthrough_paths: tuple[str, ...] = ()
    # Certificates of TLS backends are verified against this bundle (Debian's system bundle).
    ca_bundle: str = "/etc/ssl/certs/ca-certificates.crt"
    # A listener on listen_address that serves only Envoy's /stats/prometheus (the admin stays on
    # admin_address): how Prometheus sees Envoy letting requests through unrouted. None: none.
    stats_port: int | None = None
    # How Envoy sends the request body to the router. buffered: whole, in one message (Envoy holds
    # it, up to max_request_bytes; the router may fail open). full_duplex_streamed: in chunks as they
    # come, the router holding them (up to max_request_bytes) and sending the body back: the mode of
    # the Inference Extension's body-based router, which cannot fail open once chunks went out.
    # The router reads which from each stream, whatever this says (docs/gateways).
    request_body_mode: Literal["buffered", "streamed", "full_duplex_streamed"] = "buffered"
    # The request header the rendered routes match to pick a backend: the router's x-selected-model
    # (None), or the standard one it also sets (server.gateway_model_header), as an Inference
    # Extension HTTPRoute does.
    route_header: str | None = None
    # What Envoy does with an LLM call the router did not decide (no mark: router down, shed, out of
    # time, a body it never saw whole). default: the default route (fail open; a body's own backend
    # `model` still reaches it). refuse: a 503 from Envoy, nothing reaches a backend. auto: refuse
    # where a prompt guard blocks (action: block), else default.
    undecided: Literal["auto", "default", "refuse"] = "auto"

    @property
    def reads_pinned_model(self) -> bool:
        """Whether the rendered config reads a body's `model` itself before the router (buffered mode:
        Envoy holds the whole body then anyway), routes on it where the router chose nothing, and
        stamps the request for the router's shedding."""
        return self.request_body_mode == "buffered"

    def __post_init__(self):
        require(0 <= self.trusted_hops <= 10, "trusted_hops", "must be between 0 and 10")
        require(self.route_header is None or bool(_HEADER.match(self.route_header)), "route_header",
                "must be a lower-case header name")
        for i, prefix in enumerate(self.passthrough_paths):
            require(prefix.startswith("/") and prefix.isprintable() and " " not in prefix,
                     f"passthrough_paths[{i}]", "must be a path starting with '/'")
        require(self.request_timeout_s > 0, "request_timeout_s", "must be positive")
        require(self.undecided in ("auto", "default", "refuse"), "undecided",
                f"must be auto, default or refuse, got {self.undecided!r}")
        require(self.max_heap_bytes >= 64 * 1024 * 1024, "max_heap_bytes", "must be at least 64 MiB")
        require(20 <= self.max_request_headers <= 10000, "max_request_headers", "must be between 20 and 10000")
        for name in ("listen_port", "admin_port", "stats_port"):
            port = getattr(self, name)
            require(port is None or 1 <= port <= 65535, name, "must be a port number")
        require(self.max_request_bytes >= 1024, "max_request_bytes", "must be at least 1024")
        require(self.upstream_timeout_s > 0, "upstream_timeout_s", "must be positive")
