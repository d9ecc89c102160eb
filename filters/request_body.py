"""Reads the model and the prompt out of an LLM API request body (OpenAI, Anthropic shapes)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


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


def parse_body(raw: bytes, path: str) -> ParsedBody:
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
    return ParsedBody(data, model, extract_prompt(data, path))


def extract_prompt(data: dict[str, Any], path: str) -> str | None:
    if path.endswith("/completions") and not path.endswith("/chat/completions"):
        return _legacy_prompt(data.get("prompt"))
    if path.endswith("/responses"):
        return _responses_prompt(data.get("input"))
    return _last_user_message(data.get("messages"))


def _text_of(content: Any) -> str | None:
    """String content, or the text parts of a content-part array (images etc. ignored)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            p["text"]
            for p in content
            if isinstance(p, dict) and p.get("type") in ("text", "input_text") and isinstance(p.get("text"), str)
        ]
        return "\n".join(parts) if parts else None
    return None


def _last_user_message(messages: Any) -> str | None:
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            text = _text_of(message.get("content"))
            if text and text.strip():
                return text
    return None


def _legacy_prompt(prompt: Any) -> str | None:
    if isinstance(prompt, list):
        prompt = prompt[-1] if prompt and all(isinstance(p, str) for p in prompt) else None
    return prompt if isinstance(prompt, str) and prompt.strip() else None


def _responses_prompt(items: Any) -> str | None:
    if isinstance(items, str):
        return items if items.strip() else None
    return _last_user_message([i for i in items if isinstance(i, dict)] if isinstance(items, list) else None)
