"""Conversations through the real Envoy: a follow-up that names no topic keeps its route, a clear
topic change switches, and agent traffic (tool calls, tool results, harness text) is routed on the
user's words. Router: router.yaml's routes (math, code, general), conversation.policy track."""

from __future__ import annotations

import httpx

from tests.support.stack import metric, scrape

MATH = "Solve the equation 4x - 7 = 21 for x"
FOLLOW_UP = "Thanks! Can you go over that last step once more?"
CODE = "Write a Python function that merges two sorted lists"


def post(stack, path: str, body: dict) -> httpx.Response:
    r = httpx.post(f"{stack.url}{path}", json=body, timeout=10)
    assert r.status_code == 200, r.text
    return r


def chat(stack, messages: list[dict]) -> tuple[str, str, str]:
    r = post(stack, "/v1/chat/completions", {"model": "auto", "messages": messages})
    return r.headers["x-mock-backend"], r.headers["x-semantic-route"], r.headers["x-semantic-route-reason"]


def test_follow_up_keeps_its_route_and_a_topic_change_switches(stack):
    before = metric(scrape(stack.metrics_url), "semantic_router_requests_total", 'outcome="context"')
    # Alone, the follow-up names no route: it would go to the default backend.
    assert chat(stack, [{"role": "user", "content": FOLLOW_UP}]) == ("general-model", "general", "default")

    convo = [{"role": "user", "content": MATH}]
    assert chat(stack, convo) == ("math-model", "math", "matched")
    convo += [{"role": "assistant", "content": "x = 7."}, {"role": "user", "content": FOLLOW_UP}]
    assert chat(stack, convo) == ("math-model", "math", "context")
    convo += [{"role": "assistant", "content": "Add 7 to both sides, then divide by 4."},
              {"role": "user", "content": CODE}]
    assert chat(stack, convo) == ("code-model", "code", "matched")
    convo += [{"role": "assistant", "content": "def merge(a, b): ..."}, {"role": "user", "content": "Yes, that works."}]
    assert chat(stack, convo) == ("code-model", "code", "context")

    after = metric(scrape(stack.metrics_url), "semantic_router_requests_total", 'outcome="context"')
    assert after - before == 2


def test_earlier_turns_come_from_the_embedding_cache(stack):
    text = scrape(stack.metrics_url)
    hits = metric(text, "semantic_router_embedding_cache_total", 'result="hit"')
    # Turns of the default route: the static tier never decides those, so each request's turns are
    # the encoder's to embed (a turn the static tier decides is embedded first when it is context).
    convo = [{"role": "user", "content": "Tell me about the history of the Roman empire"}]
    for follow_up in ("ok", "and what came after it?", "great, thanks"):
        chat(stack, convo)
        convo += [{"role": "assistant", "content": "..."}, {"role": "user", "content": follow_up}]
    chat(stack, convo)
    # Requests 2, 3 and 4 re-send 1, 2 and 3 earlier turns: every one a hit.
    assert metric(scrape(stack.metrics_url), "semantic_router_embedding_cache_total", 'result="hit"') - hits >= 6


def test_openai_agent_loop_routes_on_the_users_words(stack):
    messages = [
        {"role": "system", "content": "You are a coding agent. Solve equations and integrals when asked."},
        {"role": "user", "content": CODE},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "solve", "arguments": "{\"equation\": \"4x - 7 = 21\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Solve the equation: x = 7; integral of x^2 is x^3/3"},
    ]
    assert chat(stack, messages)[:2] == ("code-model", "code")


def test_anthropic_tool_results_and_reminders_keep_the_users_route(stack):
    body = {"model": "auto", "max_tokens": 64, "system": "Solve equations for the user.", "messages": [
        {"role": "user", "content": [
            {"type": "text", "text": "<system-reminder>Solve the equation 2x = 4 and compute the integral.</system-reminder>"},
            {"type": "text", "text": CODE}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "calc", "input": {"q": "2x = 4"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "Solve the equation: x = 2"}]},
    ]}
    r = post(stack, "/v1/messages", body)
    assert (r.headers["x-mock-backend"], r.headers["x-semantic-route"]) == ("code-model", "code")


def test_responses_follow_up_keeps_its_route(stack):
    body = {"model": "auto", "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": MATH}]},
        {"type": "function_call", "call_id": "f1", "name": "python", "arguments": "{\"code\": \"print(1)\"}"},
        {"type": "function_call_output", "call_id": "f1", "output": "Traceback: NameError in python function"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": FOLLOW_UP}]},
    ]}
    r = post(stack, "/v1/responses", body)
    assert (r.headers["x-mock-backend"], r.headers["x-semantic-route"], r.headers["x-semantic-route-reason"]) == (
        "math-model", "math", "context")
