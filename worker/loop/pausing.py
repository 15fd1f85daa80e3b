"""Pausing owned partitions while too many records are in flight.

A worker bounds the records it has consumed but not yet committed (what a crash would
make the group consume again). At the bound it pauses every owned partition and keeps
polling, so the group never sees a stalled member; once half the bound has drained it
resumes them. A pipeline with a share of the bound (``Share``: a bulk pipeline beside a
latency-sensitive one) has its own, smaller limit on the records it has consumed and
not committed: fetches are cut short (``fetch_limit``) so that it never goes past it,
at it only its partitions pause, and they resume once one batch's worth has drained,
so the other pipelines' partitions keep flowing and the bound keeps room for their
records. A pipeline waiting for its model (a batch of it parked, ``worker.loop.threads``)
has its partitions paused until the batch goes on, and its records do not count against
the bound meanwhile (they cannot grow while paused), so its stuck batches never pause
the other pipelines. Pausing is per
partition in librdkafka and outlives ownership: a partition paused, revoked and later
assigned again stays paused. So a newly assigned partition is paused while a limit that
covers it holds, and resumed if this worker had left it paused; others are not touched,
since a resume restarts a partition's fetcher.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import TopicPartition

from worker.core import PartitionKey

__all__ = [
    "SHARE_FETCH_WAIT_MS",
    "PartitionSwitch",
    "PausingManager",
    "Share",
    "describe_partitions",
    "share_fetch_options",
]

log = logging.getLogger(__name__)


SHARE_FETCH_WAIT_MS = 50
"""librdkafka's ``fetch.wait.max.ms`` for a worker where a pipeline has a share (unless
the config sets it). A resumed partition is fetched with the consumer's next fetch
request, which waits up to this long while the other partitions are quiet: at
librdkafka's default of 500 ms a bulk backlog beside an idle interactive pipeline
drained at a fifth of its speed (measured: 1,015 against 4,993 records/s); a fetch
returns as soon as records come, so only an idle consumer's request rate changes."""


def share_fetch_options(options: Mapping[str, object]) -> dict[str, int]:
    """The consumer settings shares need, where ``options`` (those the config gives the
    consumer) leave them to the worker."""
    if "fetch.wait.max.ms" in options:
        return {}
    return {"fetch.wait.max.ms": SHARE_FETCH_WAIT_MS}


class PartitionSwitch(Protocol):
    """What pausing needs of the source (``worker.kafka.source.Source``)."""

    def pause(self, partitions: set[PartitionKey]) -> None: ...

    def resume(self, partitions: set[PartitionKey]) -> None: ...


@dataclass(frozen=True, slots=True)
class Share:
    """One pipeline's part of the bound: its partitions (those of ``topics``) pause when
    its records consumed and not committed (in flight, or in its open batch) reach
    ``pause_at``, and resume at ``resume_at`` or fewer."""

    pipeline: str
    topics: frozenset[str]
    pause_at: int
    resume_at: int

    @classmethod
    def of(cls, pipeline: str, topics: Collection[str], records: int, batch: int) -> Share:
        """A share of ``records`` that resumes once one ``batch`` has drained below it."""
        return cls(pipeline, frozenset(topics), records, max(0, records - batch))


class PausingManager:
    """Decides, once per loop turn, which owned partitions are paused. Loop thread only."""

    def __init__(
        self,
        switch: PartitionSwitch,
        bound: int,
        on_change: Callable[[int], None] = lambda _paused: None,
        shares: Sequence[Share] = (),
        on_share: Callable[[str, bool], None] = lambda _pipeline, _held: None,
        topics: Mapping[str, Collection[str]] | None = None,
    ) -> None:
        """``bound``: records in flight at which partitions pause (they resume at half);
        ``on_change`` hears how many partitions are paused after every decision;
        ``shares`` are the pipelines' own limits, and ``on_share`` hears when one starts
        (True) or stops (False) holding its pipeline's partitions paused; ``topics``
        are each pipeline's request topics, for those that wait for their model."""
        self._switch = switch
        self.bound = bound
        self._on_change = on_change
        self._shares = tuple(shares)
        self._on_share = on_share
        self._bound_reached = False
        self._topics = {name: frozenset(t) for name, t in (topics or {}).items()}
        self._waiting: frozenset[str] = frozenset()
        """Pipelines waiting for their model: their partitions stay paused."""
        self._held: set[str] = set()
        """Pipelines at their share: their partitions stay paused."""
        self._paused: set[PartitionKey] = set()
        self._fresh: set[PartitionKey] = set()
        self._left_paused: set[PartitionKey] = set()
        """Partitions this worker paused and then lost or had revoked: librdkafka keeps
        them paused, should they come back."""

    @property
    def paused(self) -> frozenset[PartitionKey]:
        return frozenset(self._paused)

    @property
    def bound_reached(self) -> bool:
        """Whether every owned partition is paused for the whole bound (not a share)."""
        return self._bound_reached

    @property
    def held(self) -> frozenset[str]:
        """Pipelines whose partitions are paused because they hold their share."""
        return frozenset(self._held)

    def full(self, records: int) -> bool:
        return records >= self.bound

    def fetch_limit(self, most: int, by_pipeline: Mapping[str, int]) -> int:
        """How many records the next fetch may take: ``most``, or fewer, so that no
        pipeline whose partitions flow can go past its share (at least one)."""
        limit = most
        for share in self._shares:
            if share.pipeline not in self._held:
                limit = min(limit, share.pause_at - by_pipeline.get(share.pipeline, 0))
        return max(1, limit)

    def assigned(self, partitions: Collection[PartitionKey]) -> None:
        """Partitions assigned in a rebalance: their state is set on the next ``update``."""
        self._fresh.update(partitions)

    def forget(self, partitions: Collection[PartitionKey]) -> None:
        """Partitions revoked or lost: no longer this worker's to pause or resume."""
        self._left_paused |= self._paused.intersection(partitions)
        self._paused.difference_update(partitions)
        self._fresh.difference_update(partitions)

    def update(
        self,
        records: int,
        owned: set[PartitionKey],
        batches: int = 0,
        by_pipeline: Mapping[str, int] | None = None,
        waiting: frozenset[str] = frozenset(),
    ) -> None:
        """Pause every owned partition at the bound and resume them at half of it; pause
        a pipeline's partitions at its share (``by_pipeline``: its records consumed and
        not committed) and resume them once a batch has drained; keep the partitions of
        the pipelines ``waiting`` for their model paused. ``records`` leaves out those of
        the ``waiting`` pipelines; ``batches`` (in flight) is for the log."""
        fresh, self._fresh = self._fresh & owned, set()
        if waiting != self._waiting:
            for name in sorted(waiting - self._waiting):
                log.warning("pipeline %s waits for its model: pausing its partitions", name)
            for name in sorted(self._waiting - waiting):
                log.info("pipeline %s: its model takes batches again, resuming", name)
            self._waiting = waiting
        was_reached = self._bound_reached
        if records >= self.bound:
            self._bound_reached = True
        elif records <= self.bound // 2:
            self._bound_reached = False
        counts = by_pipeline or {}
        for share in self._shares:
            held = counts.get(share.pipeline, 0)
            if share.pipeline not in self._held and held >= share.pause_at:
                self._held.add(share.pipeline)
                self._on_share(share.pipeline, True)
            elif share.pipeline in self._held and held <= share.resume_at:
                self._held.discard(share.pipeline)
                self._on_share(share.pipeline, False)
        wanted = self._wanted(owned)
        newly = wanted - self._paused
        released = (self._paused - wanted) & owned
        if self._bound_reached != was_reached:
            if self._bound_reached:
                log.info(
                    "backpressure: %d records in %d batches in flight (bound %d), pausing %s",
                    records,
                    batches,
                    self.bound,
                    describe_partitions(newly),
                )
            else:
                log.info(
                    "backpressure over: %d records in flight, resuming %s",
                    records,
                    describe_partitions(released),
                )
        elif newly or released:  # a share: often, for a bulk backlog
            log.debug(
                "in-flight shares: %s at their share, pausing %s, resuming %s",
                sorted(self._held) or "none",
                describe_partitions(newly),
                describe_partitions(released),
            )
        if newly:
            self._switch.pause(newly)
            self._paused |= newly
        if released:
            self._switch.resume(released)
            self._paused -= released
        # only those an earlier ownership left paused: a resume restarts the partition's
        # fetcher, which costs most of a second before records flow
        stale = (fresh - wanted) & self._left_paused
        if stale:
            self._switch.resume(stale)
        self._left_paused -= fresh
        self._on_change(len(self._paused))

    def _wanted(self, owned: set[PartitionKey]) -> set[PartitionKey]:
        """The owned partitions some limit holds paused now."""
        if self._bound_reached:
            return set(owned)
        if not self._held and not self._waiting:
            return set()
        topics = frozenset().union(
            *(s.topics for s in self._shares if s.pipeline in self._held),
            *(self._topics.get(name, ()) for name in self._waiting),
        )
        return {key for key in owned if key[0] in topics}


def describe_partitions(partitions: Collection[PartitionKey] | Collection[TopicPartition]) -> str:
    """``topic[0, 2], other[1]``: partitions grouped by topic, for log lines."""
    by_topic: dict[str, list[int]] = {}
    for item in partitions:
        topic, partition = (
            (item.topic, item.partition) if isinstance(item, TopicPartition) else item
        )
        by_topic.setdefault(topic, []).append(partition)
    return ", ".join(f"{t}{sorted(p)}" for t, p in sorted(by_topic.items())) or "nothing"
