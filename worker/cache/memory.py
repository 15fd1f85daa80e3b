"""The output cache's in-process tier: a bounded map from row key to encoded outputs.

Least recently used entries leave first once ``max_entries`` are held. It is read and
written a batch at a time from the stage threads (the enrich thread promotes Redis hits
into it, the model thread reads it and stores what it computed), so every call takes
one lock for the whole batch. Built on ``collections.OrderedDict``, whose
``move_to_end`` and ``popitem(last=False)`` are the LRU in C; a library would add a
dependency for the same two calls.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence

__all__ = ["MemoryTier"]


class MemoryTier:
    """Up to ``max_entries`` key -> value pairs; 0 keeps none."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[bytes, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get_many(self, keys: Sequence[bytes], rows: Iterable[int]) -> dict[int, bytes]:
        """Values of ``keys[r]`` for each of ``rows`` that is held, by row; each one found
        becomes the most recently used."""
        found: dict[int, bytes] = {}
        if not self.max_entries:
            return found
        entries = self._entries
        get, touch = entries.get, entries.move_to_end
        with self._lock:
            for r in rows:
                value = get(keys[r])
                if value is not None:
                    touch(keys[r])
                    found[r] = value
        return found

    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> int:
        """Hold each (key, value) as the most recently used; returns how many of the
        least recently used entries left to make room."""
        if not self.max_entries:
            return 0
        entries = self._entries
        touch = entries.move_to_end
        with self._lock:
            for key, value in items:
                entries[key] = value
                touch(key)
            over = len(entries) - self.max_entries
            for _ in range(max(0, over)):
                entries.popitem(last=False)
        return max(0, over)
