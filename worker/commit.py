"""Offset commits that follow confirmed delivery.

Batches are committed in the order they were produced: a batch's offsets (next offset,
i.e. last + 1, per partition) are committed only when its deliveries and those of every
earlier batch have all succeeded. An offset that would move a partition backwards is
refused. Asynchronous commits that the broker rejects (a rebalance was in progress, say)
come back through ``settle`` and are sent again with the next commit. A failed
delivery stops commits for good: the caller must stop the worker so the uncommitted
records are consumed again.

``records`` counts what a crash would make another worker consume again, which the
worker bounds: the records of uncommitted batches, those of commits the broker rejected
until a later commit of their partitions succeeds, and those of commits left unanswered
for ``STALLED_COMMIT_S``. While the group rebalances, which lasts up to a session timeout
when a member died, librdkafka holds commits back unanswered, or the broker rejects
them; counting them stops a worker from going on for the whole rebalance with nothing
committed.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from worker.errors import CommitError, SinkError
from worker.sink import DeliveryTracker

__all__ = ["Committer", "OffsetConsumer", "PartitionKey"]

log = logging.getLogger(__name__)

PartitionKey = tuple[str, int]


class OffsetConsumer(Protocol):
    """The part of ``confluent_kafka.Consumer`` the committer uses."""

    def store_offsets(self, *, offsets: list[TopicPartition]) -> None: ...

    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: bool
    ) -> list[TopicPartition] | None: ...


@dataclass(slots=True)
class _Pending:
    tracker: DeliveryTracker
    offsets: dict[PartitionKey, int]
    records: int


STALLED_COMMIT_S = 0.5
"""An asynchronous commit unanswered this long counts its records as in flight; answers
take milliseconds otherwise."""


@dataclass(slots=True)
class _Unsettled:
    """An asynchronous commit without a good answer yet, and the records it covers."""

    offsets: dict[PartitionKey, int]
    records: int
    sent_at: float = 0.0


class Committer:
    """Tracks batches in flight and commits the delivered prefix."""

    def __init__(
        self,
        consumer: OffsetConsumer,
        *,
        transactional: bool = False,
        on_done: Callable[[DeliveryTracker], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """With ``transactional`` the offsets went into each batch's transaction, so done
        batches are only retired here; ``on_done`` sees every retired batch."""
        self._consumer = consumer
        self._transactional = transactional
        self._on_done = on_done
        self._clock = clock
        self._queue: deque[_Pending] = deque()
        self._committed: dict[PartitionKey, int] = {}
        self._retry: dict[PartitionKey, int] = {}
        self._awaiting: deque[_Unsettled] = deque()
        self._rejected: list[_Unsettled] = []
        self._confirmed: dict[PartitionKey, int] = {}
        self.commits = 0
        self._records = 0

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def records(self) -> int:
        """Records a crash now would have consumed again: see the module docstring."""
        awaiting = self._awaiting
        if not awaiting:
            return self._records
        stalled_before = self._clock() - STALLED_COMMIT_S
        if awaiting[0].sent_at > stalled_before:  # the oldest is recent: all are
            return self._records
        return self._records + sum(e.records for e in awaiting if e.sent_at <= stalled_before)

    def track(
        self, tracker: DeliveryTracker, offsets: dict[PartitionKey, int], records: int = 0
    ) -> None:
        """Register a produced batch of ``records`` and the next offsets it completes."""
        self._queue.append(_Pending(tracker, offsets, records))
        self._records += records

    def commit_ready(self, *, asynchronous: bool = True) -> int:
        """Commit every leading batch whose deliveries succeeded. Raises SinkError."""
        merged: dict[PartitionKey, int] = {}
        done = 0
        released = 0
        queue = self._queue
        while queue and queue[0].tracker.done:
            head = queue[0]
            if head.tracker.errors:
                if self._transactional:
                    break  # an aborted transaction: the worker rewinds, nothing to commit
                if merged:  # what was delivered before the failure is still committed
                    self._commit(merged, asynchronous=False)
                raise SinkError(
                    f"{len(head.tracker.errors)} deliveries of a batch failed, not committing: "
                    + "; ".join(head.tracker.errors)
                )
            queue.popleft()
            self._records -= head.records
            released += head.records
            if self._on_done is not None:
                self._on_done(head.tracker)
            for tp, offset in head.offsets.items():
                if offset > merged.get(tp, -1):
                    merged[tp] = offset
            done += 1
        if self._retry:
            for tp, offset in self._retry.items():
                if offset > merged.get(tp, -1):
                    merged[tp] = offset
            self._retry.clear()
        if merged and not self._transactional:
            self._commit(merged, asynchronous, released)
        return done

    def clear(self) -> int:
        """Forget every batch in flight (a rewind to the committed offsets follows)."""
        dropped = len(self._queue)
        self._queue.clear()
        self._retry.clear()
        self._awaiting.clear()
        self._rejected.clear()
        self._confirmed.clear()
        self._records = 0
        return dropped

    def settle(
        self, err: KafkaError | None, partitions: list[TopicPartition]
    ) -> list[TopicPartition]:
        """The broker's answer to an asynchronous commit (``on_commit``); returns the
        partitions it rejected. Those are committed again with the next commit, and the
        records the commit covered count as in flight until that succeeds."""
        answered = _offsets(partitions)
        entry = next((e for e in self._awaiting if e.offsets == answered), None)
        if entry is not None:
            self._awaiting.remove(entry)
        failed = []
        confirmed = self._confirmed
        for tp in partitions:
            if err is not None or tp.error is not None:
                failed.append(tp)
            else:
                key = (tp.topic, tp.partition)
                confirmed[key] = max(tp.offset, confirmed.get(key, -1))
        if failed:
            self.requeue_failed(failed)
            if entry is not None and entry.records:
                self._rejected.append(_Unsettled(_offsets(failed), entry.records))
                self._records += entry.records
        self._release_covered()
        return failed

    def requeue_failed(self, partitions: list[TopicPartition]) -> None:
        """Offsets the broker rejected (from ``on_commit``): send them with the next commit."""
        for tp in partitions:
            key = (tp.topic, tp.partition)
            if self._committed.get(key) == tp.offset:
                self._retry[key] = tp.offset
                self._committed[key] = -1

    def _release_covered(self) -> None:
        """Rejected commits that a later good commit covers no longer count."""
        confirmed = self._confirmed

        def covered(entry: _Unsettled) -> bool:
            return all(confirmed.get(k, -1) >= off for k, off in entry.offsets.items())

        for entry in [e for e in self._rejected if covered(e)]:
            self._rejected.remove(entry)
            self._records -= entry.records
        while self._awaiting and covered(self._awaiting[0]):
            self._awaiting.popleft()  # superseded: its answer changes nothing

    def _commit(
        self, offsets: dict[PartitionKey, int], asynchronous: bool, records: int = 0
    ) -> None:
        committed = self._committed
        forward = []
        for (topic, partition), offset in offsets.items():
            previous = committed.get((topic, partition), -1)
            if offset < previous:
                log.error(
                    "refusing to commit %s[%d] backwards: %d < %d",
                    topic,
                    partition,
                    offset,
                    previous,
                )
                continue
            committed[(topic, partition)] = offset
            forward.append(TopicPartition(topic, partition, offset))
        if not forward:
            return
        try:
            self._consumer.store_offsets(offsets=forward)
            self._consumer.commit(offsets=forward, asynchronous=asynchronous)
        except KafkaException as exc:
            raise CommitError(f"commit of {len(forward)} partitions failed: {exc}") from exc
        self.commits += 1
        if asynchronous:
            self._awaiting.append(_Unsettled(_offsets(forward), records, self._clock()))

    def forget(self, partitions: Collection[PartitionKey]) -> None:
        """Drop all state of partitions this worker no longer owns."""
        keys = set(partitions)
        for pending in self._queue:
            for tp in keys.intersection(pending.offsets):
                del pending.offsets[tp]
        for tp in keys:
            self._committed.pop(tp, None)
            self._retry.pop(tp, None)
            self._confirmed.pop(tp, None)
        # their new owner consumes what this worker could not commit
        for entry in [*self._awaiting, *self._rejected]:
            for tp in keys.intersection(entry.offsets):
                del entry.offsets[tp]
        self._awaiting = deque(e for e in self._awaiting if e.offsets)
        for entry in [e for e in self._rejected if not e.offsets]:
            self._rejected.remove(entry)
            self._records -= entry.records

    def committed(self) -> dict[PartitionKey, int]:
        return dict(self._committed)


def _offsets(partitions: list[TopicPartition]) -> dict[PartitionKey, int]:
    return {(tp.topic, tp.partition): tp.offset for tp in partitions}
