"""An ordered chain of request filters, built-in or registered by plugins via entry points.

A filter is a class (or factory) taking its settings mapping (`filter_settings.<name>` in the
config, {} when absent) and returning an async callable `f(ctx: RequestContext) -> None`. It may
set headers (`ctx.extra_headers`), change `ctx.body` (setting `ctx.body_changed`), decide the
route (`ctx.decision`), or stop the chain with `ctx.immediate`. An optional
`async setup(engine)` runs whenever a routing engine is (re)built, before it serves; an optional
`undecided(ctx, why)` decides for a filter the chain's deadline or an error stopped before it
finished (FilterChain.run).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import types
from importlib.metadata import entry_points
from typing import Any, Awaitable, Callable, ContextManager, Mapping, Sequence

from filters.builtin import BodySizeLimit, ModelPolicy, PromptGuard, SemanticRoute
from filters.context import RequestContext
from router.engine import RoutingEngine

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "semantic_router.filters"

Filter = Callable[[RequestContext], Awaitable[None]]
Factory = Callable[[dict], Filter]

BUILTIN: dict[str, Factory] = {f.name: f for f in (ModelPolicy, SemanticRoute, BodySizeLimit, PromptGuard)}


def _itself(factory: Factory) -> Factory:
    return factory


def available_filters() -> dict[str, Callable[[], Factory]]:
    """Filter name -> a loader giving its factory.

    Plugins are imported only when a config names them, so a broken unused plugin costs nothing.
    """
    found: dict[str, Callable[[], Factory]] = {n: functools.partial(_itself, f) for n, f in BUILTIN.items()}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep.load)
    return found


class FilterChain:
    def __init__(self, filters: Sequence[Filter]):
        self.filters = list(filters)
        # A filter that reads every text the backend model reads (not only the user's turns) says
        # so with `reads_all_text = True`; the parser then splits those texts for it.
        self.reads_all_text = any(getattr(f, "reads_all_text", False) for f in self.filters)

    @classmethod
    def from_config(cls, names: Sequence[str], settings: Mapping[str, Any]) -> "FilterChain":
        found = available_filters()
        missing = [n for n in names if n not in found]
        if missing:
            raise ValueError(f"filters: unknown filter {missing[0]!r} (have: {', '.join(sorted(found))})")
        unused = sorted(set(settings) - set(names))
        if unused:
            raise ValueError(f"filter_settings.{unused[0]}: no such filter in `filters`")
        return cls([found[n]()(settings.get(n) or {}) for n in names])

    @classmethod
    async def for_engine(cls, engine: RoutingEngine, names: Sequence[str], settings: Mapping[str, Any]) -> "FilterChain":
        """The chain of `names` (with their `settings`), set up against `engine`, ready to serve beside it."""
        chain = cls.from_config(names, settings)
        await chain.setup(engine)
        return chain

    async def setup(self, engine: RoutingEngine) -> None:
        for f in self.filters:
            hook = getattr(f, "setup", None)
            if hook is not None:
                await hook(engine)

    async def run(self, ctx: RequestContext, span: Callable[[str], ContextManager] | None = None) -> str | None:
        """Runs filters in order by `ctx.deadline`; an immediate reply stops the chain. -> None, or why
        the chain ended early: "fallback_timeout" (the deadline) or "fallback_error" (a filter raised).
        `span`: a tracer's span per filter, by name.

        Then a reply a filter left half-made does not stand, and each filter that had not finished
        and must decide all the same (a guard: `undecided(ctx, why)`, by its `on_error`) decides
        now, in order: the clock never lets a request past a filter that would have refused it."""
        done = 0
        try:
            for f in self.filters:
                with span(f"semantic_router.filter.{getattr(f, 'name', type(f).__name__)}") if span \
                        else contextlib.nullcontext():
                    await _by(f(ctx), ctx.deadline)
                done += 1
                if ctx.immediate is not None:
                    return None
            return None
        except TimeoutError:
            why = "fallback_timeout"
        except Exception as exc:  # a broken filter must not fail the request, nor flood the log per request
            log.warning("filter chain failed", extra={"error": type(exc).__name__},
                        exc_info=log.isEnabledFor(logging.DEBUG))
            why = "fallback_error"
        ctx.immediate = None
        for f in self.filters[done:]:
            undecided = getattr(f, "undecided", None)
            if undecided is not None:
                undecided(ctx, why)
                if ctx.immediate is not None:
                    break
        return why


async def _by(step: Awaitable[None], deadline: float) -> None:
    """Awaits `step`, running it at once: only where it has to wait does it wait under a timer that
    ends it at `deadline` (TimeoutError). Most requests never wait (a pinned model, a static
    decision), and a timer per request (a `Timeout` and a handle pushed on the loop's heap, then
    cancelled) was a visible share of the router's Python on that path (docs/notes/static-tier-history.md,
    "the front end's own cost"). The same as
    `async with asyncio.timeout_at(deadline): await step`: a timer fires only at a wait anyway."""
    it = step.__await__()
    try:
        waiting_on = it.send(None)
    except StopIteration:
        return
    async with asyncio.timeout_at(deadline):
        await _resumed(it, waiting_on)


@types.coroutine
def _resumed(it, waiting_on):
    """Drives `it` on from the wait it stopped at, as `yield from` would: what the task sends or
    throws in (a result, or the timer's cancellation) goes to `it`."""
    while True:
        try:
            sent = yield waiting_on
        except BaseException as exc:
            try:
                waiting_on = it.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                waiting_on = it.send(sent)
            except StopIteration as stop:
                return stop.value
