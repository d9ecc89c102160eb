"""Where answers are kept: in this process, bounded in bytes, least recently used out first, each
for `ttl_s`."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable


class StoreUnavailable(Exception):
    """A shared store did not answer in time (or at all): the cache is skipped for this request."""


@dataclass
class Entry:
    answer: dict  # a chat.completion object (answers.py)
    size: int  # bytes it counts for
    upstream_s: float  # what the backend took to give it: what each hit saves
    stored_at: float = field(default_factory=time.time)


class MemoryStore:
    def __init__(self, max_bytes: int, ttl_s: float, on_drop: Callable[[str], None] = lambda key: None):
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.on_drop = on_drop  # told each key whose answer is gone (expired or pushed out)
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: str) -> Entry | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if time.time() - entry.stored_at > self.ttl_s:
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return entry

    def put(self, key: str, entry: Entry) -> None:
        if entry.size > self.max_bytes:
            return
        if key in self._entries:
            self._drop(key)
        self._entries[key] = entry
        self.bytes += entry.size
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: str) -> None:
        self.bytes -= self._entries.pop(key).size
        self.on_drop(key)
