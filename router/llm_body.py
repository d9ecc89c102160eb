"""What an LLM API request body routes on: the user's turns, the system prompt, the texts embedded
for them, and the facts rules read.

Shapes: OpenAI chat completions (string content or content parts), legacy completions (`prompt`
string or list), the Responses API (`input` string or items, `instructions`), Anthropic Messages
(`messages` plus top-level `system`). A user turn is the text the user wrote: the text parts of a
`user` message, less the blocks an agent harness adds (`requests.harness_tags`); tool calls, tool
results, images and every other role are not read (docs/conversations.md says what is read where). The
body comes decoded (a dict, or the Envoy room's lazy object): nothing here knows JSON or transport.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from typing import Any

from router.config import RequestsConfig
from router.rules import RequestFacts

_DEFAULT_POLICY = RequestsConfig()

# Texts of at most this many words are short: consecutive short messages are read as one text (the
# guard also pairs consecutive short sentences).
SHORT_WORDS = 24

# Rough characters per token, to bound routed texts without running the tokenizer on the event loop.
CHARS_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    """A tokenizer-free token count: the larger of its words and a token per 4 characters (English
    prose runs ~1.3 tokens a word, code and numbers ~1 per 3-4 characters). Linear, C-speed."""
    return max(len(text.split()), (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN)


_IMAGE_PARTS = ("image_url", "image", "input_image")


def request_facts(data: MutableMapping[str, Any], path: str) -> RequestFacts:
    """What rules and the model choice read: the whole prompt's estimated tokens (every text the
    model reads, as the guard reads it), whether tools are offered or used, whether an image is
    anywhere in the turns, the answer's token limit, structured output asked for, streaming. Each
    is read as backends' pydantic models read it (lax: "4000" and 4000.0 are 4000, "true" is
    true), so no spelling makes a request look smaller than the backend will find it."""
    tokens = sum(estimate_tokens(t) for t in model_texts(data, path, runs=False))
    items = data.get("input") if path.endswith("/responses") else data.get("messages")
    tools = any(isinstance(offered := data.get(k), list) and len(offered) > 0 for k in ("tools", "functions"))
    return RequestFacts(tokens, tools or _uses_tools(items), _has_image(items), _max_tokens(data),
                        _structured(data, path), lax_bool(data.get("stream")) is True)


# The answer's limit by API: chat completions (max_completion_tokens, formerly max_tokens), legacy
# completions and Anthropic Messages (max_tokens), the Responses API (max_output_tokens).
_MAX_TOKENS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
_STRUCTURED = ("json_schema", "json_object")
# vLLM's constrained decoding, asked for beside the OpenAI fields.
_GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs")
# What a turn that calls a tool or carries its result holds, by API: OpenAI chat (role tool or
# function, tool_calls, function_call), Anthropic (tool_use, tool_result parts), Responses items.
_TOOL_ROLES = ("tool", "function")
_TOOL_KEYS = ("tool_calls", "function_call")
_TOOL_PARTS = ("tool_use", "tool_result", "function_call", "function_call_output", "server_tool_use")
_INTEGER = re.compile(r"[+-]?\d+(?:\.0*)?")
_TRUE, _FALSE = ("true", "1", "yes", "on", "y", "t"), ("false", "0", "no", "off", "n", "f")


def lax_int(value: Any) -> int | None:
    """An integer as pydantic reads one in lax mode: an int, a float without a fraction, a string
    of either (spaces around it allowed). None: not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and len(value) <= 32 and _INTEGER.fullmatch(value.strip()):
        return int(float(value.strip())) if "." in value else int(value.strip())
    return None


def lax_bool(value: Any) -> bool | None:
    """A boolean as pydantic reads one in lax mode (true, 1, "yes", "on", ...). None: not one."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        return True if word in _TRUE else False if word in _FALSE else None
    return None


def _max_tokens(data: Mapping[str, Any]) -> int:
    """The largest answer limit any of the API's keys asks for (a backend reading either key may
    use it)."""
    limits = [lax_int(data.get(key)) for key in _MAX_TOKENS]
    return max([n for n in limits if n is not None and n > 0], default=0)


def _structured(data: Mapping[str, Any], path: str) -> bool:
    """response_format (chat completions) or text.format (Responses API) of a JSON type, or vLLM's
    guided decoding."""
    if path.endswith("/responses"):
        text = data.get("text")
        asked = text.get("format") if isinstance(text, dict) else None
    else:
        asked = data.get("response_format")
    return (isinstance(asked, dict) and asked.get("type") in _STRUCTURED) or any(
        data.get(k) not in (None, "", [], {}) for k in _GUIDED)


def _uses_tools(items: Any) -> bool:
    """A turn calls a tool or carries a tool's result: the model must read tool turns."""
    if not isinstance(items, list):
        return False
    for m in items:
        if not isinstance(m, dict):
            continue
        if m.get("role") in _TOOL_ROLES or m.get("type") in _TOOL_PARTS:
            return True
        if any(m.get(k) not in (None, []) for k in _TOOL_KEYS):
            return True
        content = m.get("content")
        if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") in _TOOL_PARTS for p in content):
            return True
    return False


def _has_image(value: Any, depth: int = 0) -> bool:
    """An image part anywhere in the turns: in a message's content, or nested in a tool's result."""
    if depth > 16:
        return False
    if isinstance(value, list):
        return any(_has_image(v, depth + 1) for v in value if isinstance(v, (list, dict)))
    if isinstance(value, dict):
        if value.get("type") in _IMAGE_PARTS:
            return True
        return any(_has_image(v, depth + 1) for v in value.values() if isinstance(v, (list, dict)))
    return False


def conversation_of(data: Mapping[str, Any], path: str, strip: tuple[str, ...] = ()) -> tuple[list[str], str | None]:
    """(the user's turns, oldest first; the system prompt or None) of a request body."""
    if path.endswith("/completions") and not path.endswith("/chat/completions"):
        return _legacy_prompt(data.get("prompt")), None
    if path.endswith("/responses"):
        items = data.get("input")
        turns = [t for t in [content_text(items, strip)] if t] if isinstance(items, str) else _user_turns(items, strip)
        return turns, _joined([content_text(data.get("instructions")), _system_of(items)])
    messages = data.get("messages")
    return _user_turns(messages, strip), content_text(data.get("system")) if "system" in data else _system_of(messages)


def texts_to_route(turns: list[str], system: str | None, policy: RequestsConfig = _DEFAULT_POLICY,
                   max_turns: int = 1) -> tuple[tuple[str, ...], bool]:
    """What is embedded for a conversation, the one place the server, `eval` and `fit` build it, and
    whether a text is estimated longer than the encoder's window (prompt_max_tokens). `max_turns` > 1
    (conversation.policy track): each of the last `max_turns` turns on its own; 1: the last
    `prompt_turns` joined oldest first, the system prompt first if `include_system`. Each text is
    bounded at twice `prompt_max_tokens` in characters, keeping the part `requests.truncate` names."""
    if max_turns > 1:
        texts = turns[-max_turns:]
    else:
        turns = turns[-policy.prompt_turns :]
        joined = _joined([system, *turns] if policy.include_system else turns)
        texts = [joined] if joined else []
    cap = 2 * policy.prompt_max_tokens * CHARS_PER_TOKEN
    return (tuple(capped(t, cap, policy.truncate) for t in texts),
            any(estimate_tokens(t) > policy.prompt_max_tokens for t in texts))


def capped(text: str, cap: int, keep: str = "tail") -> str:
    """At most `cap` characters of `text`: its start (head), its end (tail), or half of each (ends)."""
    if len(text) <= cap:
        return text
    if keep == "head":
        return text[:cap]
    if keep == "tail":
        return text[-cap:]
    half = cap // 2
    return text[:half] + "\n" + text[len(text) - (cap - half - 1):]


def _joined(texts: Sequence[str | None]) -> str | None:
    return "\n".join(t for t in texts if t) or None


def content_text(content: Any, strip: tuple[str, ...] = ()) -> str | None:
    """String content, or the text parts of a content-part array (images, tool calls and tool
    results ignored), less the harness blocks of the tags in `strip`."""
    if isinstance(content, list):
        content = "\n".join(
            p["text"]
            for p in content
            if isinstance(p, dict) and p.get("type") in ("text", "input_text") and isinstance(p.get("text"), str)
        )
    if not isinstance(content, str):
        return None
    if strip and "<" in content:
        content = without_blocks(content, strip)
    return content if content.strip() else None


def harness_blocks(text: str, tag: str) -> Iterator[tuple[int, int, int, int]]:
    """(start, content start, content end, end) of each whole <tag ...>...</tag> block of `text`.
    Linear: a tag left open ends the search (a regex would rescan the rest of the text at every
    unclosed one)."""
    opening, closing = "<" + tag, "</" + tag + ">"
    i = 0
    while (j := text.find(opening, i)) >= 0:
        k = j + len(opening)
        if text[k : k + 1] not in (">", " ", "\n", "\t", "\r"):  # <tagname-longer>: not this tag
            i = k
            continue
        end = text.find(closing, k)
        if end < 0:
            return
        content = text.find(">", k, end)
        yield j, (k if content < 0 else content + 1), end, end + len(closing)
        i = end + len(closing)


def without_blocks(text: str, tags: tuple[str, ...]) -> str:
    """`text` less every <tag ...>...</tag> block of `tags`."""
    for tag in tags:
        kept, i = [], 0
        for start, _, _, stop in harness_blocks(text, tag):
            kept.append(text[i:start])
            i = stop
        if kept:
            kept.append(text[i:])
            text = "".join(kept)
    return text.strip()


def _user_turns(messages: Any, strip: tuple[str, ...]) -> list[str]:
    """Each `user` message's own text (Responses items included); one made only of tool results or
    harness text is not a turn."""
    if not isinstance(messages, list):
        return []
    out = []
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "user":
            text = content_text(m.get("content"), strip)
            if text:
                out.append(text)
    return out


def _system_of(messages: Any) -> str | None:
    if not isinstance(messages, list):
        return None
    return _joined([
        content_text(m.get("content"))
        for m in messages
        if isinstance(m, dict) and m.get("role") in ("system", "developer")
    ])


def _legacy_prompt(prompt: Any) -> list[str]:
    if isinstance(prompt, list):
        prompt = prompt[-1] if prompt and all(isinstance(p, str) for p in prompt) else None
    return [prompt] if isinstance(prompt, str) and prompt.strip() else []


_SURROGATE = re.compile("[\ud800-\udfff]")


def well_formed(text: str) -> str:
    """`text` with each lone surrogate (a JSON escape like \\ud800 with no pair) as U+FFFD, as Go's
    reader and the tokenizer's own input take it: the tokenizer refuses a lone surrogate, which
    would leave the text unread (the guard then undecided)."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def model_texts(data: MutableMapping[str, Any], path: str, runs: bool = True) -> Iterator[str]:
    """Every text the model reads; `runs`: also consecutive short messages joined (what the guard
    reads: each such text a second time, so not for counting tokens)."""
    if path.endswith("/completions") and not path.endswith("/chat/completions"):
        prompt = data.get("prompt")
        yield from _strings(prompt if isinstance(prompt, list) else [prompt])
        return
    for key in ("system", "instructions"):
        if key in data:
            yield from _strings([data.get(key)])
    for key in ("tools", "functions"):  # the model reads the tool definitions it is offered
        if isinstance(data.get(key), list):
            yield from _tool_strings(data[key])
    items = data.get("input") if path.endswith("/responses") else data.get("messages")
    yield from _strings(items if isinstance(items, list) else [items])
    if runs:
        yield from _short_runs(items)


def _short_runs(items: Any) -> Iterator[str]:
    """Consecutive short messages read as one text, as the model reads them in turn: an injection
    sent a word a message is read whole."""
    if not isinstance(items, list):
        return
    run: list[str] = []
    for m in [*items, None]:
        text = content_text(m.get("content")) if isinstance(m, dict) else None
        if text is not None and len(text.split()) <= SHORT_WORDS:
            run.append(text)
            continue
        if len(run) > 1:
            yield " ".join(run)
        run = []


# reasoning_content (DeepSeek, vLLM), reasoning (OpenRouter), summary (a Responses reasoning item),
# refusal: text an assistant turn carries that the model reads back on the next call
_TEXT_KEYS = ("content", "text", "arguments", "output", "input", "thinking", "reasoning_content", "reasoning",
              "summary", "refusal")


def _tool_strings(value: Any, depth: int = 0) -> Iterator[str]:
    """Every string of a tool definition (names, descriptions, a schema's property names, enums,
    defaults) but the schema's own vocabulary (`type` values)."""
    if isinstance(value, str):
        if value.strip():
            yield value
    elif depth > 16:
        return
    elif isinstance(value, list):
        for v in value:
            yield from _tool_strings(v, depth + 1)
    elif isinstance(value, dict):
        for k, v in value.items():
            if k == "properties" and isinstance(v, dict):
                yield from (name for name in v if isinstance(name, str) and name.strip())
            if k != "type":
                yield from _tool_strings(v, depth + 1)


def _strings(values: list[Any], depth: int = 0) -> Iterator[str]:
    """Every string in `values` a model reads as text: strings themselves, and the text-bearing
    members of objects (content, text, tool arguments and outputs), at any depth."""
    for v in values:
        if isinstance(v, str):
            if v.strip():
                yield v
        elif depth > 16:  # MAX_DEPTH already bounds a parsed body; this bounds a plugin's
            continue
        elif isinstance(v, list):
            parts = [p["text"] for p in v if isinstance(p, dict) and isinstance(p.get("text"), str)]
            if len(parts) > 1:  # content parts: the model reads them one after another, as one text
                yield " ".join(parts)
            yield from _strings(v, depth + 1)
        elif isinstance(v, dict):
            members = [v[k] for k in _TEXT_KEYS if k in v]
            for k in ("function", "tool_calls"):  # a tool call's arguments
                if isinstance(v.get(k), (dict, list)):
                    members.append(v[k])
            yield from _strings(members, depth + 1)
