"""The router's configuration: one YAML file, validated at load into frozen dataclasses."""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from batching import BatcherSettings
from router.calibration import CalibrationConfig
from router.settings_loader import ConfigError, SettingError, build

__all__ = ["ConfigError", "RouterConfig", "load_config", "parse_config"]

_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HEADER_SAFE = re.compile(r"^[A-Za-z0-9._:/@+-]{1,128}$")
_TAG = re.compile(r"^[A-Za-z][A-Za-z0-9_:-]{0,63}$")

# What agent harnesses put into the user's turn besides the user's words: Claude Code's reminders,
# hook output and slash-command echoes; Cline's and Roo's environment details; IDE context.
HARNESS_TAGS = (
    "system-reminder", "user-prompt-submit-hook", "command-name", "command-message", "command-args",
    "local-command-stdout", "local-command-stderr", "environment_details", "ide_selection",
    "ide_opened_file", "ide_diagnostics",
)


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise SettingError(key, message)


def _header_safe(value: str, key: str) -> None:
    # Route names and models become header values; only a safe alphabet may reach Envoy.
    _require(bool(_HEADER_SAFE.match(value)), key, f"{value!r} must match {_HEADER_SAFE.pattern}")


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
        _require(parts.scheme in ("http", "https") and bool(parts.hostname), "url",
                 f"must be an http:// or https:// base URL, got {self.url!r}")
        _require(parts.username is None and parts.password is None, "url",
                 "must not carry credentials: name an environment variable in api_key_env")
        _require(not parts.query and not parts.fragment, "url", "must have no query or fragment")
        _require(self.api_key_env is None or bool(_ENV_NAME.match(self.api_key_env)), "api_key_env",
                 f"must be an environment variable name, got {self.api_key_env!r}")
        _require(self.timeout_ms > 0, "timeout_ms", "must be positive")
        _require(1 <= self.max_batch <= 2048, "max_batch", "must be between 1 and 2048")
        _require(1 <= self.max_in_flight <= 64, "max_in_flight", "must be between 1 and 64")
        _require(parts.scheme != "http" or self.api_key_env is None or self.insecure_http, "url",
                 "http:// would send the API key in clear: use https://, or set insecure_http: true")


@dataclass(frozen=True)
class EncoderConfig:
    model: str = "bundled:all-MiniLM-L6-v2"  # bundled:NAME, a local path, or a hub name
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # The model runtime. onnx: ONNX Runtime on the CPU, no torch (the model's export, made by
    # `semantic-router export` / make models). torch: sentence-transformers (CPU or CUDA). auto:
    # torch where the device is (or auto finds) CUDA, else onnx.
    backend: str = "auto"
    # onnx only: int8 (MatMuls in int8 with a scale per token, so batch-independent: 1.3x the
    # routed req/s, 0.6x the CPU, slightly different routes; README "Model runtime") or fp32.
    # auto: fp32 (the same vectors as torch), the model's own on torch.
    precision: str = "auto"
    max_seq_length: int | None = None  # None: the model's own limit
    cpu_threads: int | None = None  # None: one per available core
    half_precision: bool = True  # fp16 on CUDA; ignored on CPU
    cpu_bf16: bool = False  # bf16 autocast on CPU: ~1.8x faster where the CPU has bf16 units, slightly different scores
    torchscript: bool = True  # CPU: run the model as one traced graph (checked against eager at load)
    # A model process to embed through (its Unix socket, e.g. a node's embedding DaemonSet): the
    # router loads no model then, and the keys above are that process's business. None: the model
    # runs in this router (in its own model process when server.workers > 1).
    socket: str | None = None
    # An embedding engine to send batches to (the keys above other than `socket` then go unused).
    remote: RemoteEncoderConfig | None = None

    def __post_init__(self):
        _require(bool(_DEVICE.match(self.device)), "device", f"must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        _require(self.backend in ("auto", "torch", "onnx"), "backend", f"must be auto, torch or onnx, got {self.backend!r}")
        _require(not (self.backend == "onnx" and self.device.startswith("cuda")), "backend",
                 "onnx runs on the CPU: use backend torch (or auto) for a CUDA device")
        _require(self.precision in ("auto", "fp32", "int8"), "precision",
                 f"must be auto, fp32 or int8, got {self.precision!r}")
        _require(not (self.precision == "int8" and self.backend == "torch"), "precision",
                 "int8 is the ONNX Runtime export's: use backend onnx (or auto on a CPU)")
        _require(self.max_seq_length is None or self.max_seq_length >= 8, "max_seq_length", "must be at least 8")
        _require(self.cpu_threads is None or self.cpu_threads >= 1, "cpu_threads", "must be at least 1")


# Members of a request body set_body may not write: the router's own (`model`) and what carries
# the prompt, which routing and the guard read (changing them would forward text never examined).
_BODY_RESERVED = frozenset({"model", "messages", "prompt", "input", "system", "instructions"})


def _keywords(words: tuple[str, ...], key: str) -> None:
    for i, word in enumerate(words):
        _require(bool(word.strip()) and word == word.strip() and len(word) <= 128, f"{key}[{i}]",
                 "must be a non-empty word or phrase of at most 128 characters, without surrounding spaces")


def _json_value(value: object, key: str, depth: int = 0) -> None:
    ok = depth < 16 and (value is None or isinstance(value, (str, bool, int, float, list, dict)))
    _require(ok and not (isinstance(value, float) and not math.isfinite(value)), key,
             "must be a JSON value (string, number, true/false, null, list or mapping)")
    if isinstance(value, list):
        for i, v in enumerate(value):
            _json_value(v, f"{key}[{i}]", depth + 1)
    elif isinstance(value, dict):
        for k, v in value.items():
            _require(isinstance(k, str), key, "mapping keys must be strings")
            _json_value(v, f"{key}.{k}", depth + 1)


def _body_members(members: dict) -> None:
    for k, v in members.items():
        _require(isinstance(k, str) and k not in _BODY_RESERVED, f"set_body.{k}",
                 f"cannot be set: {', '.join(sorted(_BODY_RESERVED))} are the router's or the prompt's")
        _json_value(v, f"set_body.{k}")


@dataclass(frozen=True)
class RouteConfig:
    name: str
    model: str
    # Examples of the route's prompts; may be empty when keywords or rules reach the route.
    utterances: tuple[str, ...] = ()
    threshold: float | None = None  # None: the config's default_threshold; range checked by RouterConfig (its scale)
    description: str | None = None
    # Case-insensitive whole words or phrases: a routed text holding one goes here, with no embedding.
    keywords: tuple[str, ...] = ()
    # Top-level JSON members written into the body forwarded for this route (reasoning_effort, ...).
    set_body: dict = field(default_factory=dict)
    # Below this confidence (x-semantic-route-confidence) the default route takes the request; None:
    # the config's min_confidence.
    min_confidence: float | None = None

    def __post_init__(self):
        _header_safe(self.name, "name")
        _header_safe(self.model, "model")
        _keywords(self.keywords, "keywords")
        _body_members(self.set_body)
        _require(self.min_confidence is None or 0.0 <= self.min_confidence <= 1.0, "min_confidence",
                 "must be between 0 and 1")


@dataclass(frozen=True)
class RuleCondition:
    """What a request must show for a rule to match: every condition given holds."""

    min_prompt_tokens: int | None = None  # the whole prompt, estimated (extproc.request_body.request_facts)
    max_prompt_tokens: int | None = None
    has_tools: bool | None = None  # the request offers tools (`tools` / `functions`)
    has_images: bool | None = None  # a message carries an image
    keywords: tuple[str, ...] = ()  # any of these, as routes[].keywords match

    def __post_init__(self):
        _keywords(self.keywords, "keywords")
        for name in ("min_prompt_tokens", "max_prompt_tokens"):
            value = getattr(self, name)
            _require(value is None or value >= 0, name, "must not be negative")
        _require(self.min_prompt_tokens is None or self.max_prompt_tokens is None
                 or self.min_prompt_tokens <= self.max_prompt_tokens, "max_prompt_tokens",
                 "must be at least min_prompt_tokens")
        _require(any(getattr(self, f.name) not in (None, ()) for f in dataclasses.fields(self)), "",
                 "needs at least one condition (min_prompt_tokens, max_prompt_tokens, has_tools, has_images, keywords)")


@dataclass(frozen=True)
class RuleConfig:
    when: RuleCondition
    route: str  # a route's name, or the default route's


@dataclass(frozen=True)
class DefaultRouteConfig:
    name: str
    model: str
    # Optional examples of traffic that belongs to no route: a prompt closer to these than to
    # any route goes to the default route (and they are a class of their own for a trained head).
    utterances: tuple[str, ...] = ()
    set_body: dict = field(default_factory=dict)  # as routes[].set_body, for requests routed here

    def __post_init__(self):
        _header_safe(self.name, "name")
        _header_safe(self.model, "model")
        _body_members(self.set_body)


@dataclass(frozen=True)
class ClassifierConfig:
    method: Literal["similarity", "head"] = "similarity"
    top_k: int = 1  # similarity: a route's score aggregates its k most similar utterances
    aggregation: Literal["max", "mean"] = "mean"
    head_path: str | None = None  # head: weights from `semantic-router fit --head`; None trains on the utterances at load
    head_epochs: int = 300
    # head: what a route's score (and so its threshold) is. probability: its best class's softmax
    # probability. energy: the log-sum-exp of all the head's logits, less the log-probability by which
    # the route's best class trails the top class (the top route scores the energy itself). Softmax
    # normalises confidence away, so an out-of-scope prompt can still win one class clearly; the
    # energy keeps how strongly the prompt matched anything (Liu et al., NeurIPS 2020).
    head_score: Literal["probability", "energy"] = "probability"

    def __post_init__(self):
        _require(self.top_k >= 1, "top_k", "must be at least 1")
        _require(self.head_epochs >= 1, "head_epochs", "must be at least 1")

    @property
    def scale(self) -> str:
        """What scores (and so thresholds and the conversation gate) measure: similarity, probability or energy."""
        return self.head_score if self.method == "head" else "similarity"

    @property
    def bounded(self) -> bool:
        """Whether scores lie in [-1, 1]."""
        return self.scale != "energy"


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
    # The front end's event loop: uvloop or asyncio's own (no difference measured here: README,
    # "Model runtime"); auto: uvloop where installed (the runtime lock has it), else asyncio.
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"

    def __post_init__(self):
        _require(self.workers == "auto" or 1 <= self.workers <= 64, "workers", "must be auto or between 1 and 64")
        _require(self.event_loop in ("auto", "asyncio", "uvloop"), "event_loop",
                 f"must be auto, asyncio or uvloop, got {self.event_loop!r}")
        for name in ("grpc_port", "metrics_port"):
            _require(0 <= getattr(self, name) <= 65535, name, "must be a port number (0 picks a free one)")
        _require(self.deadline_ms > 0, "deadline_ms", "must be positive")
        _require(self.shutdown_grace_s >= 0, "shutdown_grace_s", "must not be negative")
        _require(self.shutdown_delay_s >= 0, "shutdown_delay_s", "must not be negative")
        _require(self.watch_config_s >= 0, "watch_config_s", "must not be negative")


# The most pieces the body parser splits a request's texts into for a filter that reads them all
# (the prompt guard); past it the parser stops, and such a filter cannot decide.
GUARD_MAX_PIECES = 4096


@dataclass(frozen=True)
class RequestsConfig:
    model_aliases: tuple[str, ...] = ("auto",)  # models that mean "route me"
    unknown_model: Literal["route", "reject"] = "route"
    max_body_bytes: int = 4 * 1024 * 1024
    prompt_turns: int = 1  # conversation.policy last_turns: route on the last N user turns, joined
    include_system: bool = False  # last_turns: prepend the system prompt to what is routed on
    # The encoder's window as routing assumes it (the bundled model's: 256 tokens): a routed text
    # estimated longer is counted as truncated; it is first cut to twice this estimate in characters
    # (what any encoder reads, with room for text of short tokens), then by the encoder to its window.
    prompt_max_tokens: int = 256
    # What a longer text keeps, in both cuts: its start (head), its end (tail), or half of each
    # (ends): README "Long prompts" measures them.
    truncate: Literal["head", "tail", "ends"] = "ends"
    # Blocks <tag ...>...</tag> that agent harnesses add to a user's turn; removed before routing.
    harness_tags: tuple[str, ...] = HARNESS_TAGS

    def __post_init__(self):
        for i, tag in enumerate(self.harness_tags):
            _require(bool(_TAG.match(tag)), f"harness_tags[{i}]", f"{tag!r} must match {_TAG.pattern}")
        _require(self.max_body_bytes >= 1024, "max_body_bytes", "must be at least 1024")
        _require(self.prompt_turns >= 1, "prompt_turns", "must be at least 1")
        _require(self.prompt_max_tokens >= 8, "prompt_max_tokens", "must be at least 8")


@dataclass(frozen=True)
class ConversationConfig:
    """How a request that carries a conversation is routed (router/conversation.py)."""

    # track: each of the last `max_turns` user turns is scored on its own; the most recent one that
    # is decisive (wins with a score of at least `gate`) sets the route, so a follow-up that names
    # no topic keeps the conversation's route and a turn that names a new one switches.
    # last_turns: the last `requests.prompt_turns` user turns joined, scored as one text.
    policy: Literal["track", "last_turns"] = "track"
    max_turns: int = 8
    # None: a turn is decisive when it clears its route's threshold. A trained head's probability
    # makes a good gate (`semantic-router fit` on conversations tunes it); a cosine score does not.
    # Its range is the classifier's scale: RouterConfig checks it.
    gate: float | None = None

    def __post_init__(self):
        _require(1 <= self.max_turns <= 64, "max_turns", "must be between 1 and 64")

    @property
    def turns_read(self) -> int:
        """Texts a request is routed on: its last `max_turns` user turns (track), or one, the joined
        text (last_turns)."""
        return self.max_turns if self.policy == "track" else 1


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
        _header_safe(self.model, "model")
        _require(self.ca_file is None or self.tls, "ca_file", "needs tls: true")
        _require(1 <= self.port <= 65535, "port", "must be a port number")


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

    def __post_init__(self):
        _require(0 <= self.trusted_hops <= 10, "trusted_hops", "must be between 0 and 10")
        for i, prefix in enumerate(self.passthrough_paths):
            _require(prefix.startswith("/") and prefix.isprintable() and " " not in prefix,
                     f"passthrough_paths[{i}]", "must be a path starting with '/'")
        _require(self.request_timeout_s > 0, "request_timeout_s", "must be positive")
        _require(self.max_heap_bytes >= 64 * 1024 * 1024, "max_heap_bytes", "must be at least 64 MiB")
        _require(20 <= self.max_request_headers <= 10000, "max_request_headers", "must be between 20 and 10000")
        for name in ("listen_port", "admin_port", "stats_port"):
            port = getattr(self, name)
            _require(port is None or 1 <= port <= 65535, name, "must be a port number")
        _require(self.max_request_bytes >= 1024, "max_request_bytes", "must be at least 1024")
        _require(self.upstream_timeout_s > 0, "upstream_timeout_s", "must be positive")


@dataclass(frozen=True)
class RouterConfig:
    routes: tuple[RouteConfig, ...]
    default_route: DefaultRouteConfig
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    classifier: ClassifierConfig = field(default_factory=ClassifierConfig)
    default_threshold: float = 0.5
    batching: BatcherSettings = field(default_factory=BatcherSettings)  # the batcher's own settings type
    server: ServerConfig = field(default_factory=ServerConfig)
    requests: RequestsConfig = field(default_factory=RequestsConfig)
    conversation: ConversationConfig = field(default_factory=ConversationConfig)
    filters: tuple[str, ...] = ("model_policy", "semantic_route")  # request filter chain, in order
    filter_settings: dict = field(default_factory=dict)  # filter name -> its own settings
    backends: tuple[BackendConfig, ...] = ()
    envoy: EnvoyConfig = field(default_factory=EnvoyConfig)
    cache_size: int = 8192  # embeddings of recent texts (user turns, prompts), LRU; 0 turns the cache off
    log_prompts: bool = False  # prompts are user data: off unless debugging
    # Decided before the model, first match wins (router/rules.py); then routes' keywords.
    rules: tuple[RuleConfig, ...] = ()
    # Written by `semantic-router fit`: what turns scores into x-semantic-route-confidence.
    calibration: CalibrationConfig | None = None
    # Routes below this confidence go to the default route (reason low_confidence); None: never.
    min_confidence: float | None = None

    def __post_init__(self):
        _require(len(self.routes) > 0, "routes", "needs at least one route")
        seen = {self.default_route.name}
        for i, route in enumerate(self.routes):
            _require(route.name not in seen, f"routes[{i}].name", f"duplicate route name {route.name!r}")
            seen.add(route.name)
        for i, rule in enumerate(self.rules):
            _require(rule.route in seen, f"rules[{i}].route", f"{rule.route!r} is not a route or the default route")
        ruled = {rule.route for rule in self.rules}
        for i, route in enumerate(self.routes):
            _require(bool(route.utterances) or bool(route.keywords) or route.name in ruled, f"routes[{i}].utterances",
                     "needs at least one utterance, or keywords or a rule that reach the route")
        _require(any(r.utterances for r in self.routes), "routes",
                 "at least one route needs utterances: the model routes on them")
        _require(self.min_confidence is None or 0.0 <= self.min_confidence <= 1.0, "min_confidence",
                 "must be between 0 and 1")
        # Cosine similarities and probabilities lie in [-1, 1]; a threshold outside can never be met.
        in_range = (lambda v: -1.0 <= v <= 1.0) if self.classifier.bounded else math.isfinite
        why = "must be between -1 and 1" if self.classifier.bounded else "must be a number"
        _require(in_range(self.default_threshold), "default_threshold", why)
        for i, route in enumerate(self.routes):
            _require(route.threshold is None or in_range(route.threshold), f"routes[{i}].threshold", why)
        gate = self.conversation.gate
        _require(gate is None or in_range(gate), "conversation.gate", why)
        _require(self.cache_size >= 0, "cache_size", "must not be negative")
        if self.conversation.policy == "track":
            # track reads turns one by one; joining them is what last_turns does.
            _require(self.requests.prompt_turns == 1, "requests.prompt_turns",
                     "joins turns for conversation.policy last_turns; with track leave it at 1")
            _require(not self.requests.include_system, "requests.include_system",
                     "applies to conversation.policy last_turns; track routes on the user's turns")
        seen_models = set()
        for i, b in enumerate(self.backends):
            _require(b.model not in seen_models, f"backends[{i}].model", f"{b.model!r} has two backends")
            _require(b.model in self.backend_models, f"backends[{i}].model",
                     f"{b.model!r} is not the model of any route or the default route")
            seen_models.add(b.model)

    @functools.cached_property  # asked on every request by the model policy
    def backend_models(self) -> frozenset[str]:
        return frozenset([r.model for r in self.routes] + [self.default_route.model])

    @functools.cached_property
    def route_names(self) -> tuple[str, ...]:
        """Every route's name, the default route's last: the classes of evaluation, fit and heads."""
        return tuple(r.name for r in self.routes) + (self.default_route.name,)

    def threshold_of(self, route: RouteConfig) -> float:
        return self.default_threshold if route.threshold is None else route.threshold

    def min_confidence_of(self, route: RouteConfig) -> float | None:
        return self.min_confidence if route.min_confidence is None else route.min_confidence


def parse_config(data: object, source: str = "config") -> RouterConfig:
    try:
        return build(RouterConfig, data, "")
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def load_config(path: str | Path) -> RouterConfig:
    """Relative file references in the config (classifier.head_path, a model directory beside it in
    encoder.model) resolve against its folder."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    config = parse_config(data, str(path))
    model = config.encoder.model
    if not model.startswith("bundled:") and not Path(model).is_absolute() and (path.parent / model).is_dir():
        # A model directory written beside the config (fit --finetune) is found from anywhere.
        local = str((path.parent / model).resolve())
        config = dataclasses.replace(config, encoder=dataclasses.replace(config.encoder, model=local))
    head = config.classifier.head_path
    if head is not None and not Path(head).is_absolute():
        resolved = str((path.parent / head).resolve())
        config = dataclasses.replace(config, classifier=dataclasses.replace(config.classifier, head_path=resolved))
    return config
