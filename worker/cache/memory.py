"""The output cache's in-process tier: a bounded map from row key to encoded outputs.

Two bounds apply at once: ``max_entries`` and ``max_bytes``. An entry's bytes are its
key's and value's lengths plus ``ENTRY_OVERHEAD``, what the two bytes objects and the
map's slot cost besides, so ``max_bytes`` bounds the memory the tier really takes (one
768-float output encodes to about 15 KB: 100,000 of them would take 1.5 GB). Least
recently used entries leave first once either bound is passed; an entry larger than
``max_bytes`` on its own is not kept at all, and pushes nothing out.

Entries belong to one model namespace (``worker.cache.keys.model_namespace``) at a
time: ``serve_only`` drops every entry when a reload changes it, and ``put_many`` for
another namespace keeps nothing, so a batch that ran on the old model and settles after
the reload cannot bring its rows back in.

It is read and written a batch at a time from the stage threads (the enrich thread
promotes Redis hits into it, the model stage reads it and stores what it computed) and
cleared from the reloader's, so every call takes one lock for the whole batch. Built on
``collections.OrderedDict``, whose ``move_to_end`` and ``popitem(last=False)`` are the
LRU in C; a library would add a dependency for the same two calls.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence

__all__ = ["ENTRY_OVERHEAD", "MemoryTier"]

ENTRY_OVERHEAD = 176
"""Bytes an entry costs beyond its key's and value's lengths: two bytes objects' headers
(33 each) and the ``OrderedDict``'s slot and node (about 105, measured with tracemalloc
on CPython 3.11 over 100,000 entries)."""


class MemoryTier:
    """Up to ``max_entries`` key -> value pairs taking up to ``max_bytes``, all of
    ``namespace``; either bound at 0 keeps none."""

    def __init__(self, max_entries: int, max_bytes: int, namespace: bytes = b"") -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._namespace = namespace
        self._entries: OrderedDict[bytes, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """What the entries held take, as the bound counts it."""
        return self._bytes

    def get_many(self, keys: Sequence[bytes], rows: Iterable[int]) -> dict[int, bytes]:
        """Values of ``keys[r]`` for each of ``rows`` that is held, by row; each one found
        becomes the most recently used."""
        found: dict[int, bytes] = {}
        if not self.max_entries or not self.max_bytes:
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

    def put_many(self, items: Iterable[tuple[bytes, bytes]], namespace: bytes = b"") -> int:
        """Hold each (key, value) of ``namespace`` as the most recently used; returns how
        many of the least recently used entries left to make room. Items of another
        namespace than the tier's, and single entries over ``max_bytes``, are not kept."""
        limit = self.max_bytes
        if not self.max_entries or not limit:
            return 0
        entries = self._entries
        pop = entries.pop
        with self._lock:
            if namespace != self._namespace:
                return 0
            held = self._bytes
            for key, value in items:
                cost = _cost(key, value)
                old = pop(key, None)
                if old is not None:
                    held -= _cost(key, old)
                if cost > limit:
                    continue
                entries[key] = value  # popped first, so it goes in as the newest
                held += cost
            evicted = 0
            while held > limit or len(entries) > self.max_entries:
                key, old = entries.popitem(last=False)
                held -= _cost(key, old)
                evicted += 1
            self._bytes = held
        return evicted

    def serve_only(self, namespace: bytes) -> int:
        """Keep entries of ``namespace`` only from now on: when it is not the tier's,
        every entry is dropped (a reload's new model). Returns how many were."""
        with self._lock:
            if namespace == self._namespace:
                return 0
            dropped = len(self._entries)
            self._entries.clear()
            self._bytes = 0
            self._namespace = namespace
        return dropped


def _cost(key: bytes, value: bytes) -> int:
    """What one entry counts against ``max_bytes``."""
    return len(key) + len(value) + ENTRY_OVERHEAD
