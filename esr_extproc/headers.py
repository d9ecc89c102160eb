"""What the router and Envoy's config agree on: the request headers the router owns (it sets them,
Envoy routes on them, clients may not send them) and the LLM API paths it routes."""

SELECTED_MODEL = "x-selected-model"
ROUTE = "x-semantic-route"
SCORE = "x-semantic-route-score"
REASON = "x-semantic-route-reason"
CONFIDENCE = "x-semantic-route-confidence"  # the probability the route is right (router/calibration.py)
TRUNCATED = "x-semantic-route-truncated"  # set when the routed text was longer than the encoder reads
TIER = "x-semantic-route-tier"  # which cascade tier's model decided: static or encoder (router/static_tier.py)

ROUTER_HEADERS = (SELECTED_MODEL, ROUTE, SCORE, REASON, CONFIDENCE, TRUNCATED, TIER)
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
SHOWN_TO_CLIENTS = (ROUTE, REASON, SELECTED_MODEL, CONFIDENCE, TRUNCATED, TIER)  # copied onto responses by Envoy

# Routed paths (any prefix before them: `/openai/v1/...`); every other path is refused by Envoy
# unless the config lists it in envoy.passthrough_paths.
LLM_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
