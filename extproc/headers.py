"""The request headers the router owns: it sets them, Envoy routes on them, clients may not send them."""

SELECTED_MODEL = "x-selected-model"
ROUTE = "x-semantic-route"
SCORE = "x-semantic-route-score"
REASON = "x-semantic-route-reason"

ROUTER_HEADERS = (SELECTED_MODEL, ROUTE, SCORE, REASON)
SHOWN_TO_CLIENTS = (ROUTE, REASON, SELECTED_MODEL)  # copied onto responses by Envoy
