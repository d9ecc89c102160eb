"""What the router and Envoy's config agree on: the request headers the router owns (it sets them,
Envoy routes on them, clients may not send them) and the LLM API paths it routes."""

SELECTED_MODEL = "x-selected-model"
ROUTE = "x-semantic-route"
SCORE = "x-semantic-route-score"
REASON = "x-semantic-route-reason"
CONFIDENCE = "x-semantic-route-confidence"  # the probability the route is right (router/calibration.py)
TRUNCATED = "x-semantic-route-truncated"  # set when the routed text was longer than the encoder reads
TIER = "x-semantic-route-tier"  # which cascade tier's model decided: static or encoder (router/static_tier.py)

# Where selection chose among the route's models (router/selection.py): the chosen model's predicted
# score and its price.
SELECTED_QUALITY = "x-semantic-selected-quality"
SELECTED_PRICE = "x-semantic-selected-price"
# Where selection feedback is on: the signed id an evaluator posts back with the answer's score
# (router/feedback.py). Shown to clients, who hand it to their evaluator.
SELECTION_ID = "x-semantic-selection-id"
# The route's models passed over for what they lack, "model:capability" comma-separated (router/capabilities.py).
SKIPPED = "x-semantic-route-skipped"
# The models Envoy tries in turn, comma-separated, where there are two or more: it routes the request
# to their failover cluster (docs/failover.md). Internal only, as the next.
CHAIN = "x-semantic-router-chain"
# Where the forwarded body's `model` value starts: each attempt's upstream filter writes its own
# model there. Left on for the backend, as the route headers are: a later attempt of the same
# request reads it again (Envoy hands every attempt the same request headers).
MODEL_AT = "x-semantic-router-model-at"

# Set per failover attempt by the failover cluster's upstream filters: the model of the endpoint
# Envoy picked (from its metadata, MODEL_METADATA), and the model an attempt wrote into the body.
ATTEMPT_MODEL = "x-semantic-router-attempt-model"
WRITTEN_MODEL = "x-semantic-router-written-model"
MODEL_METADATA = "semantic_router"  # the endpoint metadata namespace naming a backend's model

ROUTER_HEADERS = (SELECTED_MODEL, ROUTE, SCORE, REASON, CONFIDENCE, TRUNCATED, TIER, SKIPPED, CHAIN, MODEL_AT,
                  SELECTED_QUALITY, SELECTED_PRICE, SELECTION_ID)
# Set by the rendered Envoy config's answer keeper (a Lua filter before the router, after Envoy has
# dropped every client's copy): "Envoy hands this request's answer to the router whole", so the
# router need not watch it stream past (esr_extproc/keeper.py). Removed before the backend.
CACHE_KEEPER = "x-semantic-cache-keeper"
# Set by the rendered config just before the router's filter (a Lua filter, after Envoy has dropped
# every client's copy): when Envoy sent the request on to the router, in microseconds since the
# epoch. How long it waited to be read is the router's overload signal (server.shed_wait_ms).
# Removed before the backend.
SENT_AT = "x-semantic-router-sent-at"
# The Inference Extension's endpoint picker's choice of pod: its header, never the router's or a client's.
EPP_DESTINATION = "x-gateway-destination-endpoint"
# The dynamic-metadata namespace the router names a kept answer's entry in, for that keeper.
CACHE_NAMESPACE = "semantic_router.cache"
# Where the rendered config's json_to_metadata puts the body's `model` (empty: none), before the
# router: routes read it when the router chose nothing, and the router, sent it, knows that a
# request it sheds at the headers still reaches the model it pins.
PINNED_NAMESPACE = "semantic_router.pinned"
# The dynamic-metadata namespace the router marks each request it decided in (`reason`: why it went
# where it goes), or says why it left one undecided (`undecided`). The rendered routes send a request
# to a backend only with the mark; every other one takes the configured undecided policy
# (envoy.undecided). Only the router's answers write this namespace: a client cannot, and no header
# or body can forge or replay it (docs/bad-input.md#undecided-requests).
DECIDED_NAMESPACE = "semantic_router.decided"
# Copied onto responses by Envoy; SELECTION_ID too, by each route, with the model that answered
# appended where the request could fail over (docs/model-selection.md#feedback).
SHOWN_TO_CLIENTS = (ROUTE, REASON, SELECTED_MODEL, CONFIDENCE, TRUNCATED, TIER, SKIPPED)
# Set on responses by the rendered config: the model that answered (an attempt's upstream filter, or
# the route) and how many models were tried (docs/failover.md).
SERVED_MODEL = "x-semantic-route-served-model"
ATTEMPTS = "x-semantic-route-attempts"

# Routed paths (any prefix before them: `/openai/v1/...`); every other path is refused by Envoy
# unless the config lists it in envoy.passthrough_paths.
LLM_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
