"""Pausing the owned partitions while too many records are in flight.

A worker bounds the records it has consumed but not yet committed (what a crash would
make the group consume again). At the bound it pauses every owned partition and keeps
polling, so the group never sees a stalled member; once half the bound has drained it
resumes them. Pausing is per partition in librdkafka and outlives ownership: a partition
paused, revoked and later assigned again stays paused. So a newly assigned partition is
paused while the worker is, and resumed if this worker had left it paused; others are
not touched, since a resume restarts a partition's fetcher.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import Protocol

from confluent_kafka import TopicPartition

from worker.commit import PartitionKey

__all__ = ["PartitionSwitch", "PausingManager", "describe_partitions"]

log = logging.getLogger(__name__)


class PartitionSwitch(Protocol):
    """What pausing needs of the source (``worker.source.Source``)."""

    def pause(self, partitions: set[PartitionKey]) -> None: ...

    def resume(self, partitions: set[PartitionKey]) -> None: ...


class PausingManager:
    """Decides, once per loop turn, which owned partitions are paused. Loop thread only."""

    def __init__(
        self,
        switch: PartitionSwitch,
        bound: int,
        on_change: Callable[[int], None] = lambda _paused: None,
    ) -> None:
        """``bound``: records in flight at which partitions pause (they resume at half);
        ``on_change`` hears how many partitions are paused after every decision."""
        self._switch = switch
        self.bound = bound
        self._on_change = on_change
        self._paused: set[PartitionKey] = set()
        self._fresh: set[PartitionKey] = set()
        self._left_paused: set[PartitionKey] = set()
        """Partitions this worker paused and then lost or had revoked: librdkafka keeps
        them paused, should they come back."""

    @property
    def paused(self) -> frozenset[PartitionKey]:
        return frozenset(self._paused)

    def full(self, records: int) -> bool:
        return records >= self.bound

    def assigned(self, partitions: Collection[PartitionKey]) -> None:
        """Partitions assigned in a rebalance: their state is set on the next ``update``."""
        self._fresh.update(partitions)

    def forget(self, partitions: Collection[PartitionKey]) -> None:
        """Partitions revoked or lost: no longer this worker's to pause or resume."""
        self._left_paused |= self._paused.intersection(partitions)
        self._paused.difference_update(partitions)
        self._fresh.difference_update(partitions)

    def update(self, records: int, owned: set[PartitionKey], batches: int = 0) -> None:
        """Pause every owned partition at the bound; resume them at half of it. ``batches``
        (in flight) is only for the log line."""
        fresh, self._fresh = self._fresh & owned, set()
        if fresh:
            if self._paused:
                self._switch.pause(fresh)
                self._paused |= fresh
            else:
                # only those an earlier ownership left paused: a resume restarts the
                # partition's fetcher, which costs most of a second before records flow
                stale = fresh & self._left_paused
                if stale:
                    self._switch.resume(stale)
            self._left_paused -= fresh
        if records >= self.bound:
            newly = owned - self._paused
            if newly:
                log.info(
                    "backpressure: %d records in %d batches in flight (bound %d), pausing %s",
                    records,
                    batches,
                    self.bound,
                    describe_partitions(newly),
                )
                self._switch.pause(newly)
                self._paused |= newly
        elif self._paused and records <= self.bound // 2:
            resumed = self._paused & owned
            log.info(
                "backpressure over: %d records in flight, resuming %s",
                records,
                describe_partitions(resumed),
            )
            self._switch.resume(resumed)
            self._paused.clear()
        self._on_change(len(self._paused))


def describe_partitions(partitions: Collection[PartitionKey] | Collection[TopicPartition]) -> str:
    """``topic[0, 2], other[1]``: partitions grouped by topic, for log lines."""
    by_topic: dict[str, list[int]] = {}
    for item in partitions:
        topic, partition = (
            (item.topic, item.partition) if isinstance(item, TopicPartition) else item
        )
        by_topic.setdefault(topic, []).append(partition)
    return ", ".join(f"{t}{sorted(p)}" for t, p in sorted(by_topic.items())) or "nothing"
