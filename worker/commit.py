"""Offset commits that follow confirmed delivery.

Batches are committed in the order they were produced: a batch's offsets (next offset,
i.e. last + 1, per partition) are committed only when its deliveries and those of every
earlier batch have all succeeded. An offset that would move a partition backwards is
refused. Asynchronous commits that the broker rejects (a rebalance was in progress, say)
are reported through ``requeue_failed`` and sent again with the next commit. A failed
delivery stops commits for good: the caller must stop the worker so the uncommitted
records are consumed again.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import KafkaException, TopicPartition

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


class Committer:
    """Tracks batches in flight and commits the delivered prefix."""

    def __init__(
        self,
        consumer: OffsetConsumer,
        *,
        transactional: bool = False,
        on_done: Callable[[DeliveryTracker], None] | None = None,
    ) -> None:
        """With ``transactional`` the offsets went into each batch's transaction, so done
        batches are only retired here; ``on_done`` sees every retired batch."""
        self._consumer = consumer
        self._transactional = transactional
        self._on_done = on_done
        self._queue: deque[_Pending] = deque()
        self._committed: dict[PartitionKey, int] = {}
        self._retry: dict[PartitionKey, int] = {}
        self.commits = 0
        self.records = 0
        """Records of the batches in flight."""

    def __len__(self) -> int:
        return len(self._queue)

    def track(
        self, tracker: DeliveryTracker, offsets: dict[PartitionKey, int], records: int = 0
    ) -> None:
        """Register a produced batch of ``records`` and the next offsets it completes."""
        self._queue.append(_Pending(tracker, offsets, records))
        self.records += records

    def commit_ready(self, *, asynchronous: bool = True) -> int:
        """Commit every leading batch whose deliveries succeeded. Raises SinkError."""
        merged: dict[PartitionKey, int] = {}
        done = 0
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
            self.records -= head.records
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
            self._commit(merged, asynchronous)
        return done

    def clear(self) -> int:
        """Forget every batch in flight (a rewind to the committed offsets follows)."""
        dropped = len(self._queue)
        self._queue.clear()
        self._retry.clear()
        self.records = 0
        return dropped

    def requeue_failed(self, partitions: list[TopicPartition]) -> None:
        """Offsets the broker rejected (from ``on_commit``): send them with the next commit."""
        for tp in partitions:
            key = (tp.topic, tp.partition)
            if self._committed.get(key) == tp.offset:
                self._retry[key] = tp.offset
                self._committed[key] = -1

    def _commit(self, offsets: dict[PartitionKey, int], asynchronous: bool) -> None:
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

    def forget(self, partitions: Collection[PartitionKey]) -> None:
        """Drop all state of partitions this worker no longer owns."""
        keys = set(partitions)
        for pending in self._queue:
            for tp in keys.intersection(pending.offsets):
                del pending.offsets[tp]
        for tp in keys:
            self._committed.pop(tp, None)
            self._retry.pop(tp, None)

    def committed(self) -> dict[PartitionKey, int]:
        return dict(self._committed)
