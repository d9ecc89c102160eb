"""The whole file's schema: each room's section where that room declares it, and the checks that
span sections."""

from __future__ import annotations

from dataclasses import dataclass, field

from batching import BatcherSettings
from esr_cache.config import CacheConfig
from esr_extproc.config import BackendConfig, EnvoyConfig, ServerConfig
from esr_extproc.records import RecordsConfig
from esr_extproc.tracing import TracingConfig
from esr_model.config import ModelConfig
from esr_remote.config import RemoteEncoderConfig
from esr_settings import require
from router.config import RoutingConfig


@dataclass(frozen=True)
class EncoderConfig(ModelConfig):
    """Where embeddings come from: the model in this process (ModelConfig's keys), a model process's
    socket, or a remote engine."""

    # A model process to embed through (its Unix socket, e.g. a node's embedding DaemonSet): the
    # router loads no model then, and the keys above are that process's business. None: the model
    # runs in this router (in its own model process when server.workers > 1).
    socket: str | None = None
    # An embedding engine to send batches to (the keys above other than `socket` then go unused).
    remote: RemoteEncoderConfig | None = None


@dataclass(frozen=True)
class RouterConfig(RoutingConfig):
    """The whole config file: the routing sections (RoutingConfig) and every other room's."""

    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    batching: BatcherSettings = field(default_factory=BatcherSettings)
    server: ServerConfig = field(default_factory=ServerConfig)
    filters: tuple[str, ...] = ("model_policy", "semantic_route")  # request filter chain, in order
    filter_settings: dict = field(default_factory=dict)  # filter name -> its own settings
    backends: tuple[BackendConfig, ...] = ()
    envoy: EnvoyConfig = field(default_factory=EnvoyConfig)
    log_prompts: bool = False  # prompts are user data: off unless debugging
    cache: CacheConfig = field(default_factory=CacheConfig)  # the response cache (docs/response-cache.md)
    records: RecordsConfig = field(default_factory=RecordsConfig)  # decision records (docs/records-and-replay.md)
    tracing: TracingConfig = field(default_factory=TracingConfig)  # OpenTelemetry traces (docs/tracing.md)
    # Backend model -> its price per million prompt tokens, for what `replay` says a change costs.
    prices: dict = field(default_factory=dict)

    def __post_init__(self):
        super().__post_init__()
        for i, route in enumerate(self.cache.semantic_routes):
            require(route in self.route_names, f"cache.semantic_routes[{i}]", f"{route!r} is not a route")
        for route in self.cache.semantic_thresholds:
            require(route in self.route_names, f"cache.semantic_thresholds.{route}", f"{route!r} is not a route")
        require(self.envoy.route_header in (None, "x-selected-model", self.server.gateway_model_header),
                "envoy.route_header", "must be x-selected-model or server.gateway_model_header: the headers the router sets")
        for model in self.server.base_models:
            require(model in self.backend_models, f"server.base_models.{model}",
                    f"{model!r} is not the model of any route or the default route")
        for model, price in self.prices.items():
            require(model in self.backend_models, f"prices.{model}", f"{model!r} is not the model of any route or the default route")
            require(isinstance(price, (int, float)) and not isinstance(price, bool) and price >= 0, f"prices.{model}",
                    "must be a number, 0 or more")
        self.require_models_once(self.backends, "backends", "has two backends")

    @property
    def refuses_undecided(self) -> bool:
        """envoy.undecided resolved: whether Envoy refuses (503) an LLM call the router did not decide,
        and the router refuses (429) one it would shed. auto: where a prompt guard blocks, no path it
        did not see may take a request past it (its on_error rules only what it saw and could not
        examine)."""
        if self.envoy.undecided != "auto":
            return self.envoy.undecided == "refuse"
        guard = self.filter_settings.get("prompt_guard") or {}
        return "prompt_guard" in self.filters and isinstance(guard, dict) and guard.get("action", "block") == "block"
