"""The routing sections of the config: routes, the default route, rules, the classifier, the
conversation policy, how a request is read into what is routed on (`requests`), calibration, and
the checks that tie them together (`RoutingConfig`). The
whole file composes these with the other rooms' sections (esr_config)."""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

from esr_settings import header_safe, require
from router.calibration import CalibrationConfig

_TAG = re.compile(r"^[A-Za-z][A-Za-z0-9_:-]{0,63}$")

__all__ = ["ClassifierConfig", "ConversationConfig", "DefaultRouteConfig", "FailoverConfig", "ModelCapabilities",
           "RequestsConfig", "RouteConfig", "RoutingConfig", "RuleCondition", "RuleConfig", "StaticTierConfig"]


# Members of a request body set_body may not write: the router's own (`model`) and what carries
# the prompt, which routing and the guard read (changing them would forward text never examined).
_BODY_RESERVED = frozenset({"model", "messages", "prompt", "input", "system", "instructions"})


def _keywords(words: tuple[str, ...], key: str) -> None:
    for i, word in enumerate(words):
        require(bool(word.strip()) and word == word.strip() and len(word) <= 128, f"{key}[{i}]",
                 "must be a non-empty word or phrase of at most 128 characters, without surrounding spaces")


def _json_value(value: object, key: str, depth: int = 0) -> None:
    ok = depth < 16 and (value is None or isinstance(value, (str, bool, int, float, list, dict)))
    require(ok and not (isinstance(value, float) and not math.isfinite(value)), key,
             "must be a JSON value (string, number, true/false, null, list or mapping)")
    if isinstance(value, list):
        for i, v in enumerate(value):
            _json_value(v, f"{key}[{i}]", depth + 1)
    elif isinstance(value, dict):
        for k, v in value.items():
            require(isinstance(k, str), key, "mapping keys must be strings")
            _json_value(v, f"{key}.{k}", depth + 1)


def _body_members(members: dict) -> None:
    for k, v in members.items():
        require(isinstance(k, str) and k not in _BODY_RESERVED, f"set_body.{k}",
                 f"cannot be set: {', '.join(sorted(_BODY_RESERVED))} are the router's or the prompt's")
        _json_value(v, f"set_body.{k}")


def _ranked(cfg, models_key: str = "models") -> None:
    """`model` is a one-model `models`: either names the ranked list, the first model served
    first (router/capabilities.py), and `model` is always that first one."""
    if cfg.model:
        header_safe(cfg.model, "model")
    if not cfg.models:
        require(bool(cfg.model), "model", "required key is missing (the backend model; or `models`, a ranked list)")
        object.__setattr__(cfg, "models", (cfg.model,))
    require(not cfg.model or cfg.model == cfg.models[0], "model",
            f"{cfg.model!r} must be the first of `models` ({cfg.models[0]!r}), or left out")
    object.__setattr__(cfg, "model", cfg.models[0])
    require(len(set(cfg.models)) == len(cfg.models), models_key, "names a model twice")
    require(len(cfg.models) <= MAX_RANKED, models_key, f"at most {MAX_RANKED} models")
    for i, model in enumerate(cfg.models):
        header_safe(model, f"{models_key}[{i}]")


# Models a route may rank: Envoy gets a failover cluster per ordered subset of them (the capable
# ones of a request, in rank order), 2^n of them.
MAX_RANKED = 5


@dataclass(frozen=True)
class RouteConfig:
    name: str
    model: str = ""  # the backend model; or `models`
    # Ranked: a request goes to the first that can serve it (capabilities), and on a failure to the
    # next (failover); `model` names a list of one.
    models: tuple[str, ...] = ()
    # Examples of the route's prompts; may be empty when keywords or rules reach the route.
    utterances: tuple[str, ...] = ()
    threshold: float | None = None  # None: the config's default_threshold; range checked by RoutingConfig (its scale)
    description: str | None = None
    # Case-insensitive whole words or phrases: a routed text holding one goes here, with no embedding.
    keywords: tuple[str, ...] = ()
    # Top-level JSON members written into the body forwarded for this route (reasoning_effort, ...).
    set_body: dict = field(default_factory=dict)
    # Below this confidence (x-semantic-route-confidence) the default route takes the request; None:
    # the config's min_confidence.
    min_confidence: float | None = None
    # No response headers from a model within this: the request ends with a 504, or goes to the next
    # model where the route is idempotent (failover.header_timeout_ms's default for the route). A
    # model that answers unstreamed sends its headers with the whole answer.
    header_timeout_ms: float | None = None
    # A request that timed out on a model may run again on the next: a client's slow request (a long
    # unstreamed answer) would otherwise cost every model of the chain. Refusals (5xx, 429, refused
    # or reset connections) fail over either way: the model did not answer.
    idempotent: bool = False

    def __post_init__(self):
        header_safe(self.name, "name")
        _ranked(self)
        require(self.header_timeout_ms is None or self.header_timeout_ms > 0, "header_timeout_ms", "must be positive")
        _keywords(self.keywords, "keywords")
        _body_members(self.set_body)
        require(self.min_confidence is None or 0.0 <= self.min_confidence <= 1.0, "min_confidence",
                 "must be between 0 and 1")


@dataclass(frozen=True)
class RuleCondition:
    """What a request must show for a rule to match: every condition given holds."""

    min_prompt_tokens: int | None = None  # the whole prompt, estimated (router.llm_body.request_facts)
    max_prompt_tokens: int | None = None
    has_tools: bool | None = None  # the request offers tools (`tools` / `functions`)
    has_images: bool | None = None  # a message carries an image
    keywords: tuple[str, ...] = ()  # any of these, as routes[].keywords match

    def __post_init__(self):
        _keywords(self.keywords, "keywords")
        for name in ("min_prompt_tokens", "max_prompt_tokens"):
            value = getattr(self, name)
            require(value is None or value >= 0, name, "must not be negative")
        require(self.min_prompt_tokens is None or self.max_prompt_tokens is None
                 or self.min_prompt_tokens <= self.max_prompt_tokens, "max_prompt_tokens",
                 "must be at least min_prompt_tokens")
        require(any(getattr(self, f.name) not in (None, ()) for f in dataclasses.fields(self)), "",
                 "needs at least one condition (min_prompt_tokens, max_prompt_tokens, has_tools, has_images, keywords)")


@dataclass(frozen=True)
class RuleConfig:
    when: RuleCondition
    route: str  # a route's name, or the default route's


@dataclass(frozen=True)
class DefaultRouteConfig:
    name: str
    model: str = ""
    models: tuple[str, ...] = ()  # ranked, as routes[].models
    # Optional examples of traffic that belongs to no route: a prompt closer to these than to
    # any route goes to the default route (and they are a class of their own for a trained head).
    utterances: tuple[str, ...] = ()
    set_body: dict = field(default_factory=dict)  # as routes[].set_body, for requests routed here
    header_timeout_ms: float | None = None  # as routes[].header_timeout_ms
    idempotent: bool = False  # as routes[].idempotent

    def __post_init__(self):
        header_safe(self.name, "name")
        _ranked(self)
        require(self.header_timeout_ms is None or self.header_timeout_ms > 0, "header_timeout_ms", "must be positive")
        _body_members(self.set_body)


@dataclass(frozen=True)
class ModelCapabilities:
    """What a backend model serves (router/capabilities.py). A model not listed serves anything."""

    model: str
    context_tokens: int | None = None  # prompt plus the answer's max_tokens; None: no limit known
    tools: bool = True
    images: bool = True
    structured_output: bool = True  # response_format json_schema / json_object
    streaming: bool = True

    def __post_init__(self):
        header_safe(self.model, "model")
        require(self.context_tokens is None or self.context_tokens >= 1, "context_tokens", "must be at least 1")


@dataclass(frozen=True)
class FailoverConfig:
    """What Envoy does when the model a request went to fails (docs/failover.md): the next capable
    model of the route's ranked list, with the body's `model` rewritten for it."""

    # Models tried per request, the first included (connection refused or reset, 5xx, 429, no
    # headers within header_timeout_ms); 1: no failover.
    max_attempts: int = 3
    header_timeout_ms: float | None = None  # routes' default (routes[].header_timeout_ms); None: none
    # A request that names its model (pinned): keep it (its failure is the client's to see), or
    # fail over along the ranked list of the route it is reported under, from that model on.
    pinned: Literal["keep", "failover"] = "keep"
    # A model answering this many 5xx in a row is skipped for eject_s (Envoy's outlier detection;
    # longer each time it recurs); 0: never. What the model answered only: a timeout or a reset
    # can be one client's slow request, so it ejects no one; a model that is down is found by
    # Envoy's health check instead.
    eject_after: int = 5
    eject_s: float = 30.0
    # Envoy asks every backend for health_path this often: one that refuses the connection, resets
    # it, answers 5xx or not within the interval, twice in a row, is skipped until it answers again
    # (any status below 500 is an answer: a backend that wants a key for it is up). 0: no checks.
    health_path: str = "/v1/models"
    health_interval_s: float = 2.0

    def __post_init__(self):
        require(1 <= self.max_attempts <= MAX_RANKED, "max_attempts", f"must be between 1 and {MAX_RANKED}")
        require(self.header_timeout_ms is None or self.header_timeout_ms > 0, "header_timeout_ms", "must be positive")
        require(self.pinned in ("keep", "failover"), "pinned", "must be keep or failover")
        require(self.eject_after >= 0, "eject_after", "must not be negative (0: never)")
        require(self.eject_s > 0, "eject_s", "must be positive")
        require(self.health_interval_s >= 0, "health_interval_s", "must not be negative (0: no checks)")
        require(re.fullmatch(r"/[\x21-\x7e]*", self.health_path) is not None, "health_path",
                "must be a path starting with / (no spaces or control characters)")


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
        require(self.top_k >= 1, "top_k", "must be at least 1")
        require(self.head_epochs >= 1, "head_epochs", "must be at least 1")

    @property
    def scale(self) -> str:
        """What scores (and so thresholds and the conversation gate) measure: similarity, probability or energy."""
        return self.head_score if self.method == "head" else "similarity"

    @property
    def bounded(self) -> bool:
        """Whether scores lie in [-1, 1]."""
        return self.scale != "energy"


@dataclass(frozen=True)
class StaticTierConfig:
    """The cascade's first tier (router/static_tier.py): a static embedding distilled from the encoder
    decides the prompts it is sure of, the encoder the rest. Its values are on the classifier's scale."""

    # auto: on where the encoder runs in this router (CPU, or CUDA where the model's static table
    # can be made) or behind a local model process whose table is made; off with a remote engine
    # (esr_app.placement.static_tier_on, docs/static-tier.md).
    enabled: bool | Literal["auto"] = "auto"
    head_path: str | None = None  # classifier.method head: the static tier's head (fit); None: trained on the utterances
    # classifier.method head: the rows of the static table fit trained on the examples (over the
    # distilled table: esr_tuning/static_table.py); None: the distilled table alone.
    table_path: str | None = None
    # A route's threshold for the static scores (fit tunes them); a route not named: its own threshold.
    thresholds: dict = field(default_factory=dict)
    # How far the static tier's choice must lead the runner-up for it to stand, by the route chosen
    # (the default route is always the encoder's to decide); fit picks them so held-out decisions
    # agree with the encoder's. A route not named: the encoder decides its prompts (a margin that
    # was never measured against the encoder is no margin to trust).
    accept: dict = field(default_factory=dict)
    # A static decision also needs the prompt's static vector to lie at least this near (cosine) one
    # of the static head's class prototypes (fit sets it, and saves them with the head): a prompt
    # unlike anything the head was taught is likelier out of scope than its lead says, and the
    # encoder decides it. None: no such check.
    min_similarity: float | None = None
    # Where the encoder cannot answer (the batcher overloaded or late, the model process away, the
    # model failed): guess, the route the static tier chooses for the request even below its margin,
    # under the fallback's reason (right far more often than the default route on the prompts the
    # cascade leaves to the encoder: docs/notes/static-tier-history.md, "when the tier decides, and
    # the guess"); default: the default route.
    fallback: Literal["guess", "default"] = "guess"

    def __post_init__(self):
        require(self.enabled in (True, False, "auto"), "enabled", "must be true, false or auto")
        require(self.min_similarity is None or (isinstance(self.min_similarity, (int, float))
                                                and -1 <= self.min_similarity <= 1),
                "min_similarity", "must be a number between -1 and 1, or null")
        require(self.fallback in ("guess", "default"), "fallback", "must be guess or default")
        for route, value in self.thresholds.items():
            require(isinstance(value, (int, float)) and math.isfinite(value), f"thresholds.{route}", "must be a number")
        for route, value in self.accept.items():  # .inf: the static tier never decides for the route
            require(isinstance(value, (int, float)) and not math.isnan(value) and value >= 0, f"accept.{route}",
                    "must be a number, at least 0 (.inf: never)")


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
    # Its range is the classifier's scale: RoutingConfig checks it.
    gate: float | None = None

    def __post_init__(self):
        require(1 <= self.max_turns <= 64, "max_turns", "must be between 1 and 64")

    @property
    def turns_read(self) -> int:
        """Texts a request is routed on: its last `max_turns` user turns (track), or one, the joined
        text (last_turns)."""
        return self.max_turns if self.policy == "track" else 1


# What agent harnesses put into the user's turn besides the user's words: Claude Code's reminders,
# hook output and slash-command echoes; Cline's and Roo's environment details; IDE context.
HARNESS_TAGS = (
    "system-reminder", "user-prompt-submit-hook", "command-name", "command-message", "command-args",
    "local-command-stdout", "local-command-stderr", "environment_details", "ide_selection",
    "ide_opened_file", "ide_diagnostics",
)


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
    # (ends): docs/decisions.md, "Long prompts" measures them.
    truncate: Literal["head", "tail", "ends"] = "ends"
    # Blocks <tag ...>...</tag> that agent harnesses add to a user's turn; removed before routing.
    harness_tags: tuple[str, ...] = HARNESS_TAGS

    def __post_init__(self):
        for i, tag in enumerate(self.harness_tags):
            require(bool(_TAG.match(tag)), f"harness_tags[{i}]", f"{tag!r} must match {_TAG.pattern}")
        require(self.max_body_bytes >= 1024, "max_body_bytes", "must be at least 1024")
        require(self.prompt_turns >= 1, "prompt_turns", "must be at least 1")
        require(self.prompt_max_tokens >= 8, "prompt_max_tokens", "must be at least 8")


@dataclass(frozen=True)
class SelectionFeedbackConfig:
    """Scores posted after the answer, folded into selection (router/feedback.py)."""

    enabled: bool = False
    # The environment variable holding the bearer token evaluators send; it also signs selection ids,
    # so every process of a pool (and every replica given the same token) accepts the others' ids.
    token_env: str = "SEMANTIC_ROUTER_FEEDBACK_TOKEN"
    path: str = "/semantic-router/feedback"  # POSTed through the gateway; the router answers it itself
    half_life: float = 200.0  # scores after which a (route, model)'s past counts half
    prior: float = 20.0  # scores after which a correction counts half (it is shrunk towards 0 by the evidence)
    explore: float = 0.02  # share of selected requests sent to another capable model, to keep scores coming
    max_age_s: float = 86400.0  # an id older than this is refused

    def __post_init__(self):
        require(self.half_life >= 1, "half_life", "must be at least 1")
        require(self.prior >= 0, "prior", "must not be negative")
        require(0.0 <= self.explore <= 0.2, "explore", "must be between 0 and 0.2")
        require(self.max_age_s > 0, "max_age_s", "must be positive")
        # As the router compares paths (lower case, no trailing slash) and never an LLM API path's.
        require(self.path.startswith("/") and "?" not in self.path and self.path == self.path.lower().rstrip("/")
                and "/v1/" not in self.path + "/", "path",
                "must be a lower-case path (/...) without a query or a trailing slash, outside /v1/")
        require(bool(self.token_env), "token_env", "must name an environment variable")


@dataclass(frozen=True)
class SelectionConfig:
    """Which of a decided route's capable models serves a request, by predicted quality and price
    (router/selection.py; docs/model-selection.md). Off until `path` names a quality model
    (`semantic-router select-fit` writes it, and this section)."""

    path: str | None = None  # the quality model: a score predictor per model, with calibrated margins
    strategy: Literal["cheapest_meeting_floor", "best_within_budget", "utility"] = "cheapest_meeting_floor"
    quality_floor: float = 0.8  # cheapest_meeting_floor: the score the chosen model must be predicted to reach
    route_floors: dict = field(default_factory=dict)  # route -> its own quality_floor
    budget: float | None = None  # best_within_budget: the most one request may cost, in the prices' unit
    lam: float = 0.0  # utility: predicted score less lam x price relative to the cheapest
    prices: dict = field(default_factory=dict)  # model -> price per request; select-fit writes the rows' costs
    feedback: SelectionFeedbackConfig = field(default_factory=SelectionFeedbackConfig)

    def __post_init__(self):
        require(0.0 <= self.quality_floor <= 1.0, "quality_floor", "must be between 0 and 1")
        for route, floor in self.route_floors.items():
            require(isinstance(floor, (int, float)) and not isinstance(floor, bool) and 0.0 <= floor <= 1.0,
                    f"route_floors.{route}", "must be between 0 and 1")
        require(self.budget is None or self.budget > 0, "budget", "must be positive")
        require(self.lam >= 0, "lam", "must not be negative")
        for model, price in self.prices.items():
            require(isinstance(price, (int, float)) and not isinstance(price, bool) and price > 0,
                    f"prices.{model}", "must be a positive number")
        require(self.strategy != "best_within_budget" or self.budget is not None, "budget",
                "best_within_budget needs a budget")
        require(not self.feedback.enabled or self.path is not None, "feedback.enabled",
                "feedback corrects a quality model: set selection.path")


@dataclass(frozen=True)
class RoutingConfig:
    """What decides a route: the routing sections of the file, checked together."""

    routes: tuple[RouteConfig, ...]
    default_route: DefaultRouteConfig
    classifier: ClassifierConfig = field(default_factory=ClassifierConfig)
    default_threshold: float = 0.5
    conversation: ConversationConfig = field(default_factory=ConversationConfig)
    # Decided before the model, first match wins (router/rules.py); then routes' keywords.
    rules: tuple[RuleConfig, ...] = ()
    # Written by `semantic-router fit`: what turns scores into x-semantic-route-confidence.
    calibration: CalibrationConfig | None = None
    # Routes below this confidence go to the default route (reason low_confidence); None: never.
    min_confidence: float | None = None
    cache_size: int = 8192  # embeddings of recent texts (user turns, prompts), LRU; 0 turns the cache off
    requests: RequestsConfig = field(default_factory=RequestsConfig)  # how a request is read into what is routed on
    static_tier: StaticTierConfig = field(default_factory=StaticTierConfig)  # the cascade's first tier
    capabilities: tuple[ModelCapabilities, ...] = ()  # what each backend model serves (router/capabilities.py)
    failover: FailoverConfig = field(default_factory=FailoverConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)  # quality and price among a route's models

    def __post_init__(self):
        require(len(self.routes) > 0, "routes", "needs at least one route")
        routes = {r.name for r in self.routes} | {self.default_route.name}
        for route in self.selection.route_floors:
            require(route in routes, f"selection.route_floors.{route}", "is not a route of this config")
        for model in self.selection.prices:
            require(model in self.backend_models, f"selection.prices.{model}",
                    f"{model!r} is not the model of any route or the default route")
        self.require_models_once(self.capabilities, "capabilities", "is listed twice")
        seen = {self.default_route.name}
        for i, route in enumerate(self.routes):
            require(route.name not in seen, f"routes[{i}].name", f"duplicate route name {route.name!r}")
            seen.add(route.name)
        for i, rule in enumerate(self.rules):
            require(rule.route in seen, f"rules[{i}].route", f"{rule.route!r} is not a route or the default route")
        ruled = {rule.route for rule in self.rules}
        for i, route in enumerate(self.routes):
            require(bool(route.utterances) or bool(route.keywords) or route.name in ruled, f"routes[{i}].utterances",
                    "needs at least one utterance, or keywords or a rule that reach the route")
        require(any(r.utterances for r in self.routes), "routes",
                "at least one route needs utterances: the model routes on them")
        require(self.min_confidence is None or 0.0 <= self.min_confidence <= 1.0, "min_confidence",
                "must be between 0 and 1")
        # Cosine similarities and probabilities lie in [-1, 1]; a threshold outside can never be met.
        in_range = (lambda v: -1.0 <= v <= 1.0) if self.classifier.bounded else math.isfinite
        why = "must be between -1 and 1" if self.classifier.bounded else "must be a number"
        require(in_range(self.default_threshold), "default_threshold", why)
        for i, route in enumerate(self.routes):
            require(route.threshold is None or in_range(route.threshold), f"routes[{i}].threshold", why)
        routes = {r.name for r in self.routes}
        for key, table in (("thresholds", self.static_tier.thresholds), ("accept", self.static_tier.accept)):
            for name in table:
                require(name in routes, f"static_tier.{key}.{name}", f"{name!r} is not a route (the default "
                        "route is the encoder's to decide)" if name == self.default_route.name else f"{name!r} is not a route")
        for name, value in self.static_tier.thresholds.items():
            require(in_range(value), f"static_tier.thresholds.{name}", why)
        gate = self.conversation.gate
        require(gate is None or in_range(gate), "conversation.gate", why)
        require(self.cache_size >= 0, "cache_size", "must not be negative")
        if self.conversation.policy == "track":
            # track reads turns one by one; joining them is what last_turns does.
            require(self.requests.prompt_turns == 1, "requests.prompt_turns",
                    "joins turns for conversation.policy last_turns; with track leave it at 1")
            require(not self.requests.include_system, "requests.include_system",
                    "applies to conversation.policy last_turns; track routes on the user's turns")

    @functools.cached_property  # asked on every request by the model policy
    def backend_models(self) -> frozenset[str]:
        return frozenset(m for r in self.ranked_routes for m in r.models)

    def require_models_once(self, entries: Sequence[Any], key: str, twice: str) -> None:
        """Each entry of a per-model list (`capabilities`, `backends`) names a model of some route, once."""
        seen = set()
        for i, entry in enumerate(entries):
            require(entry.model not in seen, f"{key}[{i}].model", f"{entry.model!r} {twice}")
            require(entry.model in self.backend_models, f"{key}[{i}].model",
                    f"{entry.model!r} is not the model of any route or the default route")
            seen.add(entry.model)

    @property
    def ranked_routes(self) -> tuple[RouteConfig | DefaultRouteConfig, ...]:
        """Every route with its ranked models, the default route's last."""
        return (*self.routes, self.default_route)

    @functools.cached_property
    def route_names(self) -> tuple[str, ...]:
        """Every route's name, the default route's last: the classes of evaluation, fit and heads."""
        return tuple(r.name for r in self.routes) + (self.default_route.name,)

    def threshold_of(self, route: RouteConfig) -> float:
        return self.default_threshold if route.threshold is None else route.threshold

    def min_confidence_of(self, route: RouteConfig) -> float | None:
        return self.min_confidence if route.min_confidence is None else route.min_confidence
