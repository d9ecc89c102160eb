"""An answer is kept as one chat.completion object, whichever way it came (a JSON body or a stream
of server-sent events), and replayed in the way the hit asks for: a streamed request gets events
the OpenAI SDKs accept, ending with `data: [DONE]`. An answer cut short (finish_reason `length` or
`content_filter`, a stream without [DONE]), an error or what is not understood is not kept: `read`
says which."""

from __future__ import annotations

import json
from typing import Any

# Why a choice may end and still be a whole answer; and why it ends early.
_COMPLETE = frozenset({"stop", "tool_calls", "function_call"})
_CUT = frozenset({"length", "content_filter"})

Read = tuple[dict | None, str]  # the answer and "", or None and why not: not_ok, cut_short, not_understood


def read(raw: bytes) -> Read:
    """An answer body as it came back: server-sent events, else JSON."""
    return _sse(raw) if raw.lstrip().startswith(b"data:") else _json(raw)


def from_json(raw: bytes) -> dict | None:
    return _json(raw)[0]


def from_sse(raw: bytes) -> dict | None:
    """The chat.completion a stream of chat.completion.chunk events adds up to."""
    return _sse(raw)[0]


def _ended(finish_reasons: list) -> str:
    """"" when every choice ended whole, else why not."""
    if all(r in _COMPLETE for r in finish_reasons):
        return ""
    return "cut_short" if any(r in _CUT for r in finish_reasons) else "not_understood"


def _json(raw: bytes) -> Read:
    try:
        answer = json.loads(raw)
    except ValueError:
        return None, "not_understood"
    if isinstance(answer, dict) and "error" in answer:
        return None, "not_ok"
    if not isinstance(answer, dict) or answer.get("object") != "chat.completion":
        return None, "not_understood"
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not all(isinstance(c, dict) for c in choices):
        return None, "not_understood"
    why = _ended([c.get("finish_reason") for c in choices])
    return (None, why) if why else (answer, "")


def _sse(raw: bytes) -> Read:
    events = [line[5:].strip() for line in raw.decode("utf-8", "replace").splitlines() if line.startswith("data:")]
    if not events or events[-1] != "[DONE]":
        return None, "cut_short"
    head: dict[str, Any] = {}
    choices: dict[int, dict] = {}
    usage = None
    try:
        for event in events[:-1]:
            chunk = json.loads(event)
            if chunk.get("object") != "chat.completion.chunk":
                return None, "not_understood"
            for key in ("id", "created", "model", "system_fingerprint"):
                if key in chunk and key not in head:
                    head[key] = chunk[key]
            usage = chunk.get("usage") or usage
            for part in chunk.get("choices") or []:
                choice = choices.setdefault(part["index"], {"role": "assistant", "content": [], "tools": {},
                                                            "finish_reason": None})
                delta = part.get("delta") or {}
                choice["role"] = delta.get("role", choice["role"])
                if delta.get("content"):
                    choice["content"].append(delta["content"])
                for call in delta.get("tool_calls") or []:
                    kept = choice["tools"].setdefault(call["index"], {"id": None, "type": "function",
                                                                      "function": {"name": "", "arguments": ""}})
                    kept["id"] = call.get("id") or kept["id"]
                    fn = call.get("function") or {}
                    kept["function"]["name"] += fn.get("name") or ""
                    kept["function"]["arguments"] += fn.get("arguments") or ""
                if part.get("finish_reason"):
                    choice["finish_reason"] = part["finish_reason"]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, "not_understood"
    why = _ended([c["finish_reason"] for c in choices.values()]) if choices else "not_understood"
    if why:
        return None, why
    answer: dict[str, Any] = {**head, "object": "chat.completion", "choices": []}
    for index in sorted(choices):
        c = choices[index]
        message: dict[str, Any] = {"role": c["role"], "content": "".join(c["content"]) or None}
        if c["tools"]:
            message["tool_calls"] = [c["tools"][i] for i in sorted(c["tools"])]
        answer["choices"].append({"index": index, "message": message, "finish_reason": c["finish_reason"]})
    if usage is not None:
        answer["usage"] = usage
    return answer, ""


def as_json(answer: dict) -> bytes:
    return json.dumps(answer, separators=(",", ":")).encode()


def as_sse(answer: dict) -> bytes:
    """The answer as one content event per choice, its finish, the usage, then [DONE]."""
    head = {k: answer[k] for k in ("id", "created", "model", "system_fingerprint") if k in answer}

    def event(choices: list, **extra: Any) -> str:
        return "data: " + json.dumps({**head, "object": "chat.completion.chunk", "choices": choices, **extra},
                                     separators=(",", ":")) + "\n\n"

    out = []
    for choice in answer["choices"]:
        message = choice.get("message") or {}
        delta: dict[str, Any] = {"role": message.get("role", "assistant"), "content": message.get("content") or ""}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        out.append(event([{"index": choice["index"], "delta": delta, "finish_reason": None}]))
        out.append(event([{"index": choice["index"], "delta": {}, "finish_reason": choice["finish_reason"]}]))
    if "usage" in answer:
        out.append(event([], usage=answer["usage"]))
    out.append("data: [DONE]\n\n")
    return "".join(out).encode()
