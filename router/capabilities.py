"""Which of a route's ranked models serves a request: the first whose capabilities (context,
tools, images, structured output, streaming) cover what the request asks, and, for failover, the
capable models after it in rank order. Eval and the server choose by this one code."""

from __future__ import annotations

import dataclasses

import numpy as np

from router import metrics
from router.classifier import Decision
from router.config import ModelCapabilities, RoutingConfig
from router.rules import RequestFacts
from router.selection import Selected, Selector

# What the 400 says a model lacks, by capability.
_LACKS = {
    "context": "its context is too short for the prompt and max_tokens",
    "tools": "it does not take tools",
    "images": "it does not take images",
    "structured_output": "it does not do structured output (response_format)",
    "streaming": "it does not stream",
}


def missing(capabilities: ModelCapabilities | None, facts: RequestFacts) -> str | None:
    """The first capability `facts` ask for that the model lacks; None: it can serve them."""
    if capabilities is None:
        return None
    c = capabilities
    if c.context_tokens is not None and facts.prompt_tokens + facts.max_tokens > c.context_tokens:
        return "context"
    for asked, served, name in ((facts.has_tools, c.tools, "tools"), (facts.has_images, c.images, "images"),
                                (facts.structured, c.structured_output, "structured_output"),
                                (facts.stream, c.streaming, "streaming")):
        if asked and not served:
            return name
    return None


# The route of a request no model can serve: the server refuses it (a 400 saying why:
# refusal_message), and eval, fit and replay count it as a decision for no route.
REFUSED = "(refused)"


def refusal_message(decision: Decision) -> str:
    """What a refused request lacked, from its skipped models ("model:capability")."""
    lacked = [s.rsplit(":", 1) for s in decision.skipped]  # a model's name may hold a colon
    if decision.reason == "model_pinned":
        return f"The model {decision.model!r} cannot serve this request: {_LACKS[lacked[0][1]]}."
    lacks = "; ".join(f"{model} ({_LACKS[why]})" for model, why in lacked)
    return f"No model on this gateway can serve this request: {lacks}."


class ModelChoice:
    def __init__(self, config: RoutingConfig, selector: Selector | None = None):
        """`selector`: orders a route's capable models by predicted quality and price, where the
        request's embedding is at hand (router/selection.py); None: by rank."""
        self.selector = selector
        self._capabilities = {c.model: c for c in config.capabilities}
        self._ranked = {r.name: r.models for r in config.ranked_routes}
        self._default = config.default_route.name
        self._attempts = config.failover.max_attempts
        self._pinned_fail_over = config.failover.pinned == "failover"

    @property
    def reads_facts(self) -> bool:
        """Whether any model is limited (so the parser must measure requests)."""
        return bool(self._capabilities)

    def choose(self, decision: Decision, facts: RequestFacts, vector: np.ndarray | None = None,
               static: bool = False) -> Decision:
        """`decision` with the model that serves the request and the chain Envoy fails over along.
        A route with no capable model leaves the request to the default route's models (reason
        no_capable_model); none at all, or a pinned model that cannot serve it: route REFUSED.
        `vector`: the request's embedding, where selection may order the capable models by it (`static`:
        the static tier's)."""
        if decision.reason == "model_pinned":
            return self._pinned(decision, facts)
        capable, skipped = self._split(self._ranked.get(decision.route, (decision.model,)), facts)
        if not capable and decision.route != self._default:
            more, skipped_default = self._split(self._ranked[self._default], facts)
            if more:
                metrics.NO_CAPABLE_MODEL.labels(decision.route).inc()
                return self._chosen(dataclasses.replace(decision, route=self._default, reason="no_capable_model"),
                                    more, skipped + skipped_default)
            skipped += skipped_default
        if not capable:
            return Decision(REFUSED, "", 0.0, "no_capable_model", 0.0, decision.tier, skipped=skipped)
        if self.selector is not None and vector is not None and len(capable) > 1:
            selected = self.selector.order(capable, vector, decision.route, static)
            if selected is not None:
                metrics.child(metrics.SELECTED, selected.models[0]).inc()
                metrics.child(metrics.SPEND, selected.models[0]).inc(selected.price)
                metrics.PREDICTED_QUALITY.observe(selected.quality)
                if selected.explored:
                    metrics.child(metrics.EXPLORED, selected.models[0]).inc()
                return self._chosen(decision, selected.models, skipped, selected)
        return self._chosen(decision, capable, skipped)

    def _pinned(self, decision: Decision, facts: RequestFacts) -> Decision:
        why = missing(self._capabilities.get(decision.model), facts)
        if why is not None:
            metrics.MODELS_SKIPPED.labels(decision.model, why).inc()
            return dataclasses.replace(decision, route=REFUSED, skipped=(f"{decision.model}:{why}",))
        ranked = self._ranked.get(decision.route, ())
        if not self._pinned_fail_over or decision.model not in ranked:
            return decision
        after, _ = self._split(ranked[ranked.index(decision.model) + 1:], facts)
        return self._chosen(decision, (decision.model, *after), ())

    def _split(self, ranked: tuple[str, ...], facts: RequestFacts) -> tuple[tuple[str, ...], tuple[str, ...]]:
        capable, skipped = [], []
        for model in ranked:
            why = missing(self._capabilities.get(model), facts)
            if why is None:
                capable.append(model)
            else:
                metrics.MODELS_SKIPPED.labels(model, why).inc()
                skipped.append(f"{model}:{why}")
        return tuple(capable), tuple(skipped)

    def _chosen(self, decision: Decision, capable: tuple[str, ...], skipped: tuple[str, ...],
                selected: Selected | None = None) -> Decision:
        chain = capable[:self._attempts]
        tried = chain if len(chain) > 1 else ()
        if selected is not None:  # one construction: dataclasses.replace costs ~8 us a call
            return Decision(decision.route, chain[0], decision.score, decision.reason, decision.confidence,
                            decision.tier, tried, skipped, selected.quality, selected.price, selected.selection_id)
        if (chain[0], tried, skipped) == (decision.model, decision.chain, decision.skipped):
            return decision  # most requests: a copy equal to it costs ~3 us (dataclasses.replace)
        return dataclasses.replace(decision, model=chain[0], chain=tried, skipped=skipped)
