"""Decisions made before the model: the config's `rules` (first match wins), then routes' keywords.

They cost no embedding when they decide, and they decide by the operator's word, not a guess: their
confidence is 1. Keywords match whole words or phrases, case-insensitively, in the text the request
is routed on (its last user turn, or the joined turns under conversation.policy last_turns).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from router.classifier import Decision
from router.config import RoutingConfig, RuleCondition


@dataclass(frozen=True)
class RequestFacts:
    """What rules and the choice of a capable model (router/capabilities.py) read of a request
    besides its routed text (router.llm_body.request_facts)."""

    prompt_tokens: int = 0  # the whole prompt, every role, estimated; not the capped text routed on
    has_tools: bool = False
    has_images: bool = False
    max_tokens: int = 0  # the answer's length the client allows (max_tokens and its aliases); 0: not given
    structured: bool = False  # asks for structured output (response_format json_schema / json_object)
    stream: bool = False


def keyword_pattern(words: Sequence[str]) -> re.Pattern | None:
    """Any of `words` as a whole word or phrase (any run of spaces between a phrase's words)."""
    if not words:
        return None
    alternatives = sorted((r"\s+".join(map(re.escape, w.split())) for w in words), key=len, reverse=True)
    return re.compile(r"(?<!\w)(?:" + "|".join(alternatives) + r")(?!\w)", re.IGNORECASE)


class _Rule:
    def __init__(self, when: RuleCondition, decision: Decision):
        self.when = when
        self.keywords = keyword_pattern(when.keywords)
        self.decision = decision

    def matches(self, text: str, facts: RequestFacts) -> bool:
        w = self.when
        return ((w.min_prompt_tokens is None or facts.prompt_tokens >= w.min_prompt_tokens)
                and (w.max_prompt_tokens is None or facts.prompt_tokens <= w.max_prompt_tokens)
                and (w.has_tools is None or facts.has_tools == w.has_tools)
                and (w.has_images is None or facts.has_images == w.has_images)
                and (self.keywords is None or self.keywords.search(text) is not None))


class Rules:
    def __init__(self, config: RoutingConfig):
        model_of = {r.name: r.model for r in config.routes}
        model_of[config.default_route.name] = config.default_route.model
        self._rules = [_Rule(rule.when, Decision(rule.route, model_of[rule.route], 1.0, "rule"))
                       for rule in config.rules]
        self._keywords = [(pattern, Decision(r.name, r.model, 1.0, "keyword"))
                          for r in config.routes if (pattern := keyword_pattern(r.keywords)) is not None]

    def __bool__(self) -> bool:
        return bool(self._rules or self._keywords)

    @property
    def reads_facts(self) -> bool:
        """Whether any rule reads more than the routed text (so the parser must measure the request)."""
        return bool(self._rules)

    def decide(self, text: str, facts: RequestFacts) -> Decision | None:
        for rule in self._rules:
            if rule.matches(text, facts):
                return rule.decision
        for pattern, decision in self._keywords:
            if pattern.search(text):
                return decision
        return None
