"""The micro-batcher: pure, no I/O, time from an injected clock.

A batch closes when it holds ``max_batch_size`` items or ``max_wait_ms`` after its first
item arrived, whichever comes first. The caller feeds it items, asks for closed batches,
and uses ``deadline()`` to bound how long it may block waiting for more input.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Sequence
from typing import Generic, TypeVar

from worker.config import BatchPolicy
from worker.core import Clock, monotonic_clock

__all__ = ["Batcher"]

T = TypeVar("T")


class Batcher(Generic[T]):
    """Collects items into size- and time-bounded batches, in arrival order."""

    __slots__ = (
        "_budget_s",
        "_buffer",
        "_clock",
        "_first_at",
        "_max_size",
        "_max_wait_s",
        "_window_s",
        "adaptive",
    )

    def __init__(self, policy: BatchPolicy, clock: Clock = monotonic_clock) -> None:
        self._max_size = policy.max_batch_size
        self._max_wait_s = policy.max_wait_ms / 1000.0
        self._window_s = self._max_wait_s
        budget = policy.latency_budget_ms
        self._budget_s = budget / 1000.0 if budget is not None else None
        self.adaptive = policy.mode == "adaptive"
        self._clock = clock
        self._buffer: list[T] = []
        self._first_at = 0.0

    def __len__(self) -> int:
        return len(self._buffer)

    def add(
        self, items: Sequence[T], received_since: float | None = None, age_s: float = 0.0
    ) -> list[list[T]]:
        """Buffer ``items``; return every batch that filled up (possibly none).

        ``received_since`` is the earliest clock time the items may have arrived (when the
        fetch that returned them began); an empty batch's window starts there, so a record
        never waits longer than ``max_wait_ms`` after it could have been seen. ``age_s`` is
        how old the first item already is (from its Kafka timestamp); with a latency
        budget, the window shrinks by it.
        """
        if not items:
            return []
        if not self._buffer:
            now = self._clock()
            self._first_at = now if received_since is None else min(received_since, now)
            self._window_s = self._max_wait_s
            if self._budget_s is not None:
                self._window_s = max(0.0, min(self._max_wait_s, self._budget_s - age_s))
        self._buffer.extend(items)
        full: list[list[T]] = []
        size = self._max_size
        while len(self._buffer) >= size:
            full.append(self._buffer[:size])
            del self._buffer[:size]
            self._first_at = self._clock()
            self._window_s = self._max_wait_s
        return full

    @property
    def max_wait_s(self) -> float:
        return self._max_wait_s

    def deadline(self) -> float | None:
        """Clock time at which the open batch must close, or None when empty."""
        return self._first_at + self._window_s if self._buffer else None

    def expired(self) -> list[T] | None:
        """The open batch if its window has passed, else None."""
        if self._buffer and self._clock() >= self._first_at + self._window_s:
            return self.flush()
        return None

    def flush(self) -> list[T] | None:
        """Close the open batch now (shutdown, drain); None when empty."""
        if not self._buffer:
            return None
        batch, self._buffer = self._buffer, []
        return batch

    def drop(self, keys: Collection[Hashable], key_of: Callable[[T], Hashable]) -> int:
        """Forget buffered items whose key is in ``keys`` (revoked partitions)."""
        if not self._buffer or not keys:
            return 0
        kept = [item for item in self._buffer if key_of(item) not in keys]
        dropped = len(self._buffer) - len(kept)
        self._buffer = kept
        return dropped
