"""The event loop a front end runs on: `server.event_loop` resolved (uvloop where it is installed)."""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any, Coroutine

from esr_config import ConfigError


def resolve(kind: str) -> str:
    """auto: uvloop where installed (it is in the runtime lock), else asyncio's own loop."""
    if kind == "auto":
        return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"
    return kind


def run(main: Coroutine[Any, Any, Any], kind: str) -> Any:
    if resolve(kind) == "asyncio":
        return asyncio.run(main)
    try:
        import uvloop
    except ImportError:
        main.close()
        raise ConfigError("server.event_loop: uvloop is not installed (pip install uvloop, or set asyncio)") from None
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
