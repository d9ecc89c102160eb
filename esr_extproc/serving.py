"""What a request is served with: the engine, its filter chain and the settings read with them, one
snapshot swapped whole by a reload, so no answer mixes two configs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, NamedTuple

from esr_cache.config import CacheConfig
from esr_extproc.config import ServerConfig
from filters.chain import FilterChain
from router.config import RequestsConfig
from router.engine import RoutingEngine


@dataclass(frozen=True)
class ServiceSettings:
    """What the service reads of the config, swapped with the engine on reload."""

    deadline_s: float  # a request still undecided this long after its first message gets the default route
    requests: RequestsConfig
    max_request_headers: int  # Envoy's limit (envoy.max_request_headers)
    max_inflated_bytes: int  # an encoded body may inflate to Envoy's own buffer (envoy.max_request_bytes)
    log_prompts: bool = False
    server: ServerConfig = field(default_factory=ServerConfig)  # the standard headers it sets
    cache: CacheConfig = field(default_factory=CacheConfig)  # its matching policy (the store is the process's)
    set_body: Mapping[str, dict] = field(default_factory=dict)  # route -> the members it writes (routes[].set_body)
    shed_wait_s: float = 0.0  # server.shed_wait_ms resolved for this engine (ServerConfig.shed_wait_s); 0: never
    # envoy.undecided resolved (RouterConfig.refuses_undecided): a request the router would shed is
    # refused (429, retry-after) instead, since Envoy would refuse it unmarked anyway.
    refuse_undecided: bool = False


class Serving(NamedTuple):
    engine: RoutingEngine
    chain: FilterChain
    settings: ServiceSettings
