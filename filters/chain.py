"""An ordered chain of request filters, built-in or registered by plugins via entry points."""

from __future__ import annotations

import logging
from importlib.metadata import entry_points
from typing import Awaitable, Callable, Sequence

from filters.builtin import ModelPolicy, SemanticRoute
from filters.context import RequestContext

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "semantic_router.filters"

Filter = Callable[[RequestContext], Awaitable[None]]

BUILTIN: dict[str, Callable[[], Filter]] = {
    ModelPolicy.name: ModelPolicy,
    SemanticRoute.name: SemanticRoute,
}

DEFAULT_CHAIN = (ModelPolicy.name, SemanticRoute.name)


def available_filters() -> dict[str, Callable[[], Callable[[], Filter]]]:
    """Filter name -> a loader giving its factory (a class or zero-argument callable).

    Plugins are loaded only when a config names them, so a broken unused plugin costs nothing.
    """
    found: dict[str, Callable[[], Callable[[], Filter]]] = {n: (lambda f=f: f) for n, f in BUILTIN.items()}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep.load)
    return found


class FilterChain:
    def __init__(self, filters: Sequence[Filter]):
        self.filters = list(filters)

    @classmethod
    def from_names(cls, names: Sequence[str]) -> "FilterChain":
        found = available_filters()
        missing = [n for n in names if n not in found]
        if missing:
            raise ValueError(f"filters: unknown filter {missing[0]!r} (have: {', '.join(sorted(found))})")
        return cls([found[n]()() for n in names])

    async def run(self, ctx: RequestContext) -> None:
        """Runs filters in order; an immediate reply stops the chain."""
        for f in self.filters:
            await f(ctx)
            if ctx.immediate is not None:
                return
