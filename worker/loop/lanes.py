"""Priority lanes: the queue one processing stage takes its next batch from.

Several pipelines in one worker share the processing threads, the model's above all. Each
pipeline's ``priority`` names its lane; a stage takes the oldest batch of the highest
lane whose next stage has room, so a latency-sensitive pipeline's batch goes ahead of a
bulk pipeline's waiting ones. Within a lane batches keep their order, which is all the
ordering the worker promises: pipelines read disjoint topics, so one partition's batches
always share a lane. A batch already running is never interrupted (an ONNX Runtime call
cannot be), so a higher lane waits at most for the batch each stage is running. Aging
keeps a lower lane from starving: once higher lanes have overtaken its next batch for
``max_overtaken_s``, that batch goes next. With a single lane this is a plain FIFO.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["LaneQueue", "Taken"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Taken(Generic[T]):
    """An item a stage took: its lane, how long it waited in this queue, and whether it
    went ahead of a higher lane because it had been overtaken too long."""

    item: T
    lane: int
    waited_s: float
    aged: bool


class LaneQueue(Generic[T]):
    """Items waiting for one stage, first in, first out per lane. Not thread-safe: the
    caller holds its lock."""

    def __init__(self, max_overtaken_s: float = 0.5) -> None:
        self._max_overtaken_s = max_overtaken_s
        self._lanes: dict[int, deque[tuple[T, float]]] = {}
        self._order: list[int] = []
        """Lanes seen so far, highest first."""
        self._overtaken_since: dict[int, float] = {}
        """Per lane: since when higher lanes have been taken while its next item could
        have gone."""
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def append(self, lane: int, item: T, now: float) -> None:
        queue = self._lanes.get(lane)
        if queue is None:
            queue = self._lanes[lane] = deque()
            self._order = sorted(self._lanes, reverse=True)
        queue.append((item, now))
        self._size += 1

    def count(self, lane: int, where: Callable[[T], bool] | None = None) -> int:
        """Items waiting in ``lane`` (only those ``where`` holds for, given one)."""
        queue = self._lanes.get(lane)
        if queue is None:
            return 0
        if where is None:
            return len(queue)
        return sum(1 for item, _ in queue if where(item))

    def has_ready(self, ready: Callable[[int, T], bool]) -> bool:
        """Whether ``take`` would take an item now (without taking it or counting)."""
        return any(ready(lane, item) for lane in self._order for item, _ in self._lanes[lane])

    def __iter__(self) -> Iterator[T]:
        """Every waiting item, highest lane first, in order within a lane."""
        for lane in self._order:
            for item, _ in self._lanes[lane]:
                yield item

    def clear(self) -> None:
        for queue in self._lanes.values():
            queue.clear()
        self._overtaken_since.clear()
        self._size = 0

    def take(self, ready: Callable[[int, T], bool], now: float) -> Taken[T] | None:
        """The first ``ready`` item (``ready(lane, item)``: it may go now; its next stage
        has room, say) of the highest lane that has one, or of a lower lane overtaken for
        ``max_overtaken_s``; None when no item is ready. An item that is not ready is
        passed over, not reordered: the caller makes readiness the same for items that
        must keep their order (one pipeline's). Every lower ready lane passed over starts
        (or goes on) counting."""
        since = self._overtaken_since
        if not self._size:  # what an idle thread finds at most stages: nothing to scan
            since.clear()
            return None
        if len(self._order) == 1:  # one lane: nothing overtakes, the first ready goes
            return self._take_first(self._order[0], ready, now)
        firsts: dict[int, int] = {}
        for lane in self._order:
            at = next((i for i, (item, _) in enumerate(self._lanes[lane]) if ready(lane, item)), -1)
            if at >= 0:
                firsts[lane] = at
        ready_lanes = list(firsts)
        for lane in [lane for lane in since if lane not in firsts]:
            del since[lane]  # nothing to take, or its next stage is full: not overtaken
        if not ready_lanes:
            return None
        chosen, aged = ready_lanes[0], False
        if len(ready_lanes) > 1:
            starved = [
                lane
                for lane in ready_lanes[1:]
                if lane in since and now - since[lane] >= self._max_overtaken_s
            ]
            if starved:
                chosen, aged = min(starved, key=since.__getitem__), True
            else:
                for lane in ready_lanes[1:]:
                    since.setdefault(lane, now)
        since.pop(chosen, None)
        return self._remove(chosen, firsts[chosen], now, aged)

    def _take_first(
        self, lane: int, ready: Callable[[int, T], bool], now: float
    ) -> Taken[T] | None:
        """``take`` with a single lane: its first ready item."""
        for at, (item, _) in enumerate(self._lanes[lane]):
            if ready(lane, item):
                return self._remove(lane, at, now, False)
        return None

    def _remove(self, lane: int, at: int, now: float, aged: bool) -> Taken[T]:
        queue = self._lanes[lane]
        item, queued_at = queue[at]
        del queue[at]
        self._size -= 1
        return Taken(item, lane, max(0.0, now - queued_at), aged)
