"""Which of a route's ranked models serves a request (router/capabilities.py), and the request facts
it reads (router/llm_body.request_facts)."""

from __future__ import annotations

import pytest

from esr_config import ConfigError, parse_config
from router.capabilities import REFUSED, ModelChoice, missing, refusal_message
from router.classifier import Decision
from router.config import ModelCapabilities
from router.llm_body import estimate_tokens, request_facts
from router.rules import RequestFacts

CHAT = "/v1/chat/completions"


def config(**over):
    base = {
        "routes": [
            {"name": "math", "models": ["math-model", "general-model"], "utterances": ["m1"]},
            {"name": "code", "models": ["code-model", "small-model", "general-model"], "utterances": ["c1"]},
            {"name": "vision", "model": "small-model", "utterances": ["v1"]},
        ],
        "default_route": {"name": "general", "models": ["general-model", "big-model"]},
        "capabilities": [
            {"model": "small-model", "context_tokens": 1000, "tools": False, "images": False,
             "structured_output": False, "streaming": False},
            {"model": "general-model", "context_tokens": 8000, "images": False},
        ],
    }
    base.update(over)
    return parse_config(base)


def routed(route: str, model: str, reason: str = "matched") -> Decision:
    return Decision(route, model, 0.9, reason)


def test_a_model_lacks_what_a_request_asks_and_it_does_not_serve():
    small = ModelCapabilities("small-model", context_tokens=1000, tools=False, images=True, structured_output=False)
    assert missing(small, RequestFacts(prompt_tokens=900, max_tokens=100)) is None
    assert missing(small, RequestFacts(prompt_tokens=900, max_tokens=101)) == "context"
    assert missing(small, RequestFacts(has_tools=True)) == "tools"
    assert missing(small, RequestFacts(has_images=True)) is None
    assert missing(small, RequestFacts(structured=True)) == "structured_output"
    assert missing(None, RequestFacts(prompt_tokens=10**9, has_tools=True)) is None  # not listed: serves anything


def test_the_first_capable_model_of_the_route_serves_and_the_rest_are_its_failover_chain():
    choice = ModelChoice(config())
    plain = choice.choose(routed("code", "code-model"), RequestFacts(prompt_tokens=10))
    assert (plain.model, plain.chain, plain.skipped) == ("code-model", ("code-model", "small-model", "general-model"), ())
    tools = choice.choose(routed("code", "code-model"), RequestFacts(prompt_tokens=10, has_tools=True))
    assert (tools.model, tools.chain, tools.skipped) == ("code-model", ("code-model", "general-model"), ("small-model:tools",))
    long = choice.choose(routed("code", "code-model"), RequestFacts(prompt_tokens=5000))
    assert long.chain == ("code-model", "general-model") and long.skipped == ("small-model:context",)
    assert long.route == "code" and long.reason == "matched"


def test_a_chain_is_cut_at_max_attempts_and_one_model_is_no_chain():
    choice = ModelChoice(config(failover={"max_attempts": 2}))
    assert choice.choose(routed("code", "code-model"), RequestFacts()).chain == ("code-model", "small-model")
    assert ModelChoice(config(failover={"max_attempts": 1})).choose(routed("code", "code-model"), RequestFacts()).chain == ()
    assert ModelChoice(config()).choose(routed("vision", "small-model"), RequestFacts()).chain == ()


def test_a_route_with_no_capable_model_goes_to_the_default_routes_first_capable_one():
    choice = ModelChoice(config())
    got = choice.choose(routed("vision", "small-model"), RequestFacts(has_images=True))
    assert (got.route, got.model, got.reason) == ("general", "big-model", "no_capable_model")
    assert got.skipped == ("small-model:images", "general-model:images")


def test_no_capable_model_at_all_is_a_refusal_that_says_what_is_missing():
    choice = ModelChoice(config(default_route={"name": "general", "models": ["general-model"]}))
    refused = choice.choose(routed("vision", "small-model"), RequestFacts(has_images=True))
    assert refused.route == REFUSED and refused.reason == "no_capable_model"
    assert refused.skipped == ("small-model:images", "general-model:images")
    assert refusal_message(refused) == ("No model on this gateway can serve this request: small-model (it does not "
                                        "take images); general-model (it does not take images).")


def test_a_fallback_takes_the_default_routes_models_as_any_decision_does():
    got = ModelChoice(config()).choose(Decision("general", "general-model", 0.0, "fallback_timeout"),
                                       RequestFacts(prompt_tokens=9000))
    assert (got.model, got.reason, got.skipped) == ("big-model", "fallback_timeout", ("general-model:context",))


def test_a_pinned_model_is_kept_refused_when_incapable_and_fails_over_only_when_configured():
    pinned = Decision("code", "small-model", 1.0, "model_pinned")
    keep = ModelChoice(config())
    assert keep.choose(pinned, RequestFacts()) == pinned
    refused = keep.choose(pinned, RequestFacts(has_tools=True))
    assert refused.route == REFUSED and refused.model == "small-model"
    assert refusal_message(refused) == "The model 'small-model' cannot serve this request: it does not take tools."
    along = ModelChoice(config(failover={"pinned": "failover"})).choose(pinned, RequestFacts())
    assert along.model == "small-model" and along.chain == ("small-model", "general-model")


def test_a_models_name_may_hold_a_colon():
    choice = ModelChoice(config(routes=[{"name": "a", "models": ["org:small", "org:big"], "utterances": ["u"]}],
                                capabilities=[{"model": "org:small", "tools": False}]))
    got = choice.choose(routed("a", "org:small"), RequestFacts(has_tools=True))
    assert got.model == "org:big" and got.skipped == ("org:small:tools",)
    pinned = choice.choose(Decision("a", "org:small", 1.0, "model_pinned"), RequestFacts(has_tools=True))
    assert refusal_message(pinned) == "The model 'org:small' cannot serve this request: it does not take tools."


def test_the_engine_hands_out_decisions_with_their_model_chosen():
    """Each of the engine's decisions (pinned, ruled, default, the classifier's) comes with its model
    chosen in the same call: the request never comes back to the router for it."""
    import asyncio

    from router.classifier import RouteClassifier
    from router.engine import RoutingEngine
    from tests.support.fakes import encode

    cfg = config(routes=[{"name": "math", "models": ["math-model", "general-model"], "utterances": ["m1"],
                          "keywords": ["integral"]},
                         {"name": "vision", "model": "small-model", "utterances": ["c1"]}], default_threshold=0.5)
    engine = RoutingEngine(cfg, None, RouteClassifier(cfg, encode))
    tools = RequestFacts(has_tools=True)
    assert engine.default("no_prompt", RequestFacts(prompt_tokens=9000)).model == "big-model"
    assert engine.default("no_prompt").chain == ("general-model", "big-model")  # asks nothing: the first
    long = engine.ruled("an integral", RequestFacts(prompt_tokens=9000))
    assert (long.route, long.model, long.chain, long.skipped) == ("math", "math-model", (), ("general-model:context",))
    assert engine.ruled("an integral", tools).chain == ("math-model", "general-model")
    assert engine.pinned("small-model", tools).route == REFUSED
    assert engine.pinned("small-model").model == "small-model"

    class Batcher:
        async def embed(self, text, deadline, bulk=False):
            return encode([text])[0]

    engine.batcher = Batcher()
    decided = asyncio.run(engine.decide(["c2"], float("inf"), facts=RequestFacts(has_images=True)))
    assert (decided.route, decided.model, decided.reason) == ("general", "big-model", "no_capable_model")


@pytest.mark.parametrize("change, key", [
    ({"routes": [{"name": "a", "model": "x", "models": ["y", "x"], "utterances": ["u"]}]}, "routes[0].model"),
    ({"routes": [{"name": "a", "models": ["x", "x"], "utterances": ["u"]}]}, "routes[0].models"),
    ({"routes": [{"name": "a", "models": [f"m{i}" for i in range(6)], "utterances": ["u"]}]}, "routes[0].models"),
    ({"routes": [{"name": "a", "models": ["x", "bad model"], "utterances": ["u"]}]}, "routes[0].models[1]"),
    ({"capabilities": [{"model": "nobody-model"}]}, "capabilities[0].model"),
    ({"capabilities": [{"model": "small-model"}, {"model": "small-model"}]}, "capabilities[1].model"),
    ({"capabilities": [{"model": "small-model", "context_tokens": 0}]}, "capabilities[0].context_tokens"),
    ({"failover": {"max_attempts": 0}}, "failover.max_attempts"),
    ({"failover": {"pinned": "sometimes"}}, "failover.pinned"),
    ({"routes": [{"name": "a", "model": "x", "utterances": ["u"], "header_timeout_ms": 0}]}, "routes[0].header_timeout_ms"),
])
def test_bad_ranked_models_and_capabilities_are_refused_naming_the_key(change, key):
    with pytest.raises(ConfigError) as err:
        config(**change)
    assert key in str(err.value)


def test_model_is_the_first_of_models_and_every_ranked_model_is_a_backend_model():
    c = config()
    assert c.routes[1].model == "code-model" and c.routes[2].models == ("small-model",)
    assert c.backend_models == {"math-model", "code-model", "small-model", "general-model", "big-model"}


def test_request_facts_read_the_answers_limit_structured_output_and_streaming():
    facts = request_facts({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 300,
                           "response_format": {"type": "json_schema", "json_schema": {}}, "stream": True}, CHAT)
    assert (facts.max_tokens, facts.structured, facts.stream) == (300, True, True)
    assert request_facts({"messages": [], "max_tokens": 50, "response_format": {"type": "text"}}, CHAT).structured is False
    assert request_facts({"input": "hi", "max_output_tokens": 70, "text": {"format": {"type": "json_object"}}},
                         "/v1/responses") == RequestFacts(1, False, False, 70, True, False)
    assert request_facts({"messages": [], "max_tokens": True}, CHAT).max_tokens == 0  # not a number


@pytest.mark.parametrize("limit", ["4000", " 4000 ", 4000.0, "4000.0"])
def test_an_answers_limit_is_read_as_backends_coerce_it(limit):
    # vLLM's and the OpenAI-compatible servers' pydantic models take each of these as 4000
    assert request_facts({"messages": [], "max_tokens": limit}, CHAT).max_tokens == 4000
    # a backend may read either key: the larger counts
    assert request_facts({"messages": [], "max_completion_tokens": 10, "max_tokens": limit}, CHAT).max_tokens == 4000
    assert request_facts({"messages": [], "max_tokens": "4000.5"}, CHAT).max_tokens == 0


@pytest.mark.parametrize("stream, read", [("true", True), (1, True), ("yes", True), ("false", False), (0, False)])
def test_streaming_is_read_as_backends_coerce_it(stream, read):
    assert request_facts({"messages": [], "stream": stream}, CHAT).stream is read


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}]},
     {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
    [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}],
    [{"role": "assistant", "function_call": {"name": "w", "arguments": "{}"}}],
], ids=["openai-tool-turns", "anthropic-tool-result", "legacy-function-call"])
def test_a_conversation_that_used_tools_needs_a_model_that_takes_them(messages):
    assert request_facts({"messages": messages}, CHAT).has_tools is True


def test_a_responses_item_of_a_tool_call_needs_tools():
    items = [{"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]
    assert request_facts({"input": items}, "/v1/responses").has_tools is True


def test_an_image_anywhere_in_the_turns_counts():
    nested = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}]}]}]
    assert request_facts({"messages": nested}, "/v1/messages").has_images is True
    item = [{"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_image", "image_url": "x"}]}]
    assert request_facts({"input": item}, "/v1/responses").has_images is True
    assert request_facts({"messages": [{"role": "user", "content": "an image_url"}]}, CHAT).has_images is False


def test_vllms_guided_decoding_is_structured_output():
    assert request_facts({"messages": [], "guided_json": {"type": "object"}}, CHAT).structured is True
    assert request_facts({"messages": [], "guided_choice": ["a", "b"]}, CHAT).structured is True
    assert request_facts({"messages": [], "guided_json": None}, CHAT).structured is False


def test_the_prompts_tokens_count_each_message_once():
    short = {"messages": [{"role": "user", "content": "one two three"}, {"role": "user", "content": "four five"}]}
    assert request_facts(short, CHAT).prompt_tokens == estimate_tokens("one two three") + estimate_tokens("four five")


def test_a_selected_decision_keeps_every_field_of_the_classifiers_and_sets_only_the_choice():
    import dataclasses

    import numpy as np

    from router.selection import QualityModel, Selector

    quality = QualityModel(("code-model", "small-model"), np.array([[0.0, 0.9], [0.0, 0.85]]), np.zeros(2), 0.1)
    selector = Selector(quality, "cheapest_meeting_floor", {"code-model": 10.0, "small-model": 1.0}, 0.8, None, 0.0)
    given = Decision("code", "code-model", 0.7, "matched", confidence=0.6, tier="static")
    got = ModelChoice(config(), selector).choose(given, RequestFacts(), np.zeros(1), static=False)
    chosen = {"model", "chain", "skipped", "predicted_quality", "price", "selection_id"}
    assert got.model == "small-model" and got.chain == ("small-model", "code-model", "general-model")
    assert got.predicted_quality == pytest.approx(0.85) and got.price == 1.0
    for field in dataclasses.fields(Decision):  # a field added later is carried, or listed above
        if field.name not in chosen:
            assert getattr(got, field.name) == getattr(given, field.name), field.name
