"""Reads the model and the prompt out of an LLM API request body.

Shapes: OpenAI chat completions (string content or content parts), legacy completions (`prompt`
string or list), the Responses API (`input` string or items, `instructions`), Anthropic Messages
(`messages` plus top-level `system`). Which text is "the prompt" follows the `requests` config:
the last `prompt_turns` user turns joined oldest first, the system prompt first if
`include_system`, capped at about `prompt_max_tokens` keeping the most recent text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from router.config import RequestsConfig

_DEFAULT_POLICY = RequestsConfig()

# Rough characters per token, to cap joined turns without running the tokenizer on the event loop.
CHARS_PER_TOKEN = 4


class BadBody(ValueError):
    """The body cannot be used; `kind` is the metric label and the log key."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass
class ParsedBody:
    data: dict[str, Any]
    model: str | None
    prompt: str | None  # None: no user text to route on


def parse_body(raw: bytes, path: str, policy: RequestsConfig = _DEFAULT_POLICY) -> ParsedBody:
    if not raw:
        raise BadBody("empty", "empty body")
    try:
        data = json.loads(raw)
    except UnicodeDecodeError:
        raise BadBody("not_utf8", "body is not UTF-8") from None
    except (ValueError, RecursionError):
        raise BadBody("not_json", "body is not JSON") from None
    if not isinstance(data, dict):
        raise BadBody("not_object", f"body is a JSON {type(data).__name__}, not an object")
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise BadBody("bad_model", "model is not a string")
    return ParsedBody(data, model, extract_prompt(data, path, policy))


def extract_prompt(data: dict[str, Any], path: str, policy: RequestsConfig = _DEFAULT_POLICY) -> str | None:
    if path.endswith("/completions") and not path.endswith("/chat/completions"):
        turns, system = _legacy_prompt(data.get("prompt")), None
    elif path.endswith("/responses"):
        turns, system = _responses_turns(data.get("input")), _text_of(data.get("instructions"))
    else:
        messages = data.get("messages")
        turns = _user_turns(messages)
        system = _text_of(data.get("system")) if "system" in data else _system_of(messages)
    turns = turns[-policy.prompt_turns :]
    if not turns:
        return None
    parts = ([system] if policy.include_system and system else []) + turns
    text = "\n".join(parts)
    cap = policy.prompt_max_tokens * CHARS_PER_TOKEN
    return text[-cap:] if len(text) > cap else text


def _text_of(content: Any) -> str | None:
    """String content, or the text parts of a content-part array (images etc. ignored)."""
    if isinstance(content, str):
        return content if content.strip() else None
    if isinstance(content, list):
        parts = [
            p["text"]
            for p in content
            if isinstance(p, dict) and p.get("type") in ("text", "input_text") and isinstance(p.get("text"), str)
        ]
        text = "\n".join(parts)
        return text if text.strip() else None
    return None


def _user_turns(messages: Any) -> list[str]:
    if not isinstance(messages, list):
        return []
    out = []
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "user":
            text = _text_of(m.get("content"))
            if text:
                out.append(text)
    return out


def _system_of(messages: Any) -> str | None:
    if not isinstance(messages, list):
        return None
    texts = [
        _text_of(m.get("content"))
        for m in messages
        if isinstance(m, dict) and m.get("role") in ("system", "developer")
    ]
    joined = "\n".join(t for t in texts if t)
    return joined or None


def _legacy_prompt(prompt: Any) -> list[str]:
    if isinstance(prompt, list):
        prompt = prompt[-1] if prompt and all(isinstance(p, str) for p in prompt) else None
    return [prompt] if isinstance(prompt, str) and prompt.strip() else []


def _responses_turns(items: Any) -> list[str]:
    if isinstance(items, str):
        return [items] if items.strip() else []
    return _user_turns([i for i in items if isinstance(i, dict)] if isinstance(items, list) else None)
