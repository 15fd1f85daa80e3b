"""What a failed transaction teaches the next try of the same work (exactly-once).

A record the broker refuses for itself (a keyless result on a compacted topic whose
``cleanup.policy`` the worker could not read, say) makes the whole transaction
abortable, and the rewind produces the same record again: left alone, the partition
would never move. So the refusals found in an aborted
transaction's batches are kept, by pipeline and the source of their request, and every
batch of that pipeline made after that is told them: it sends that request's dead
letter instead, as at-least-once would, and the transaction can commit. A failure that
teaches nothing (an unknown topic, a delivery timeout, a broker that aborts every
transaction) is counted, and ``FAILURES_IN_A_ROW`` of those without a commit stop the
worker, as a failed delivery does in at-least-once mode, instead of redoing the same
work for good.

Loop thread only; batches read the copy their tracker was given.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

from confluent_kafka import Message

from worker.core import NO_REFUSALS, DeliveryTracker, Job, PartitionKey, Refusal, Source
from worker.errors import SinkError

__all__ = ["FAILURES_IN_A_ROW", "Locate", "TransactionTries"]

log = logging.getLogger(__name__)

FAILURES_IN_A_ROW = 5
"""Failed transactions in a row, none teaching a refusal, that stop the worker."""

Locate = Callable[[DeliveryTracker, Message, str], "tuple[Message, Refusal] | str"]
"""The request behind a refused record and its dead letter, or why there is none."""


class TransactionTries:
    """The refusals learned from aborted transactions, and the failures in a row."""

    def __init__(self, locate: Mapping[str, Locate], limit: int = FAILURES_IN_A_ROW) -> None:
        """``locate`` per pipeline name (``Pipeline.refusal_of``)."""
        self._locate = locate
        self._limit = limit
        self._refusals: dict[tuple[str, Source], Refusal] = {}
        self._views: dict[str, Mapping[Source, Refusal]] = {}
        self.failures = 0
        """Failed transactions since the last commit that taught nothing."""

    def refusals(self, pipeline: str) -> Mapping[Source, Refusal]:
        """What a new batch of ``pipeline`` is told (a read-only copy, never changed after:
        the batch reads it on a processing thread)."""
        return self._views.get(pipeline, NO_REFUSALS)

    def failed(self, jobs: Iterable[Job], why: str) -> None:
        """The transaction of ``jobs`` was aborted for ``why`` (after the producer was
        flushed, so their delivery reports are in). Keep their refusals; raise SinkError
        when this is the ``limit``-th failure in a row that taught none."""
        if self._learn(jobs):
            return
        self.failures += 1
        if self.failures >= self._limit:
            raise SinkError(
                f"{self.failures} transactions in a row failed without a commit (the last: "
                f"{why}); stopping without a commit, the group hands the partitions on"
            )

    def committed(self, offsets: Mapping[PartitionKey, int]) -> None:
        """A transaction committed ``offsets``: the refusals before them are served."""
        self.failures = 0
        self._drop(lambda t, p, o: o < offsets.get((t, p), -1))

    def forget(self, partitions: Iterable[PartitionKey]) -> None:
        """Partitions gone to another member, which learns their refusals itself."""
        gone = set(partitions)
        self._drop(lambda t, p, _o: (t, p) in gone)

    def _learn(self, jobs: Iterable[Job]) -> int:
        learned = 0
        for job in jobs:
            tracker = job.tracker
            locate = self._locate.get(tracker.pipeline)
            while (refused := tracker.take_undeliverable()) is not None:
                produced, why = refused
                found = locate(tracker, produced, why) if locate else "no such pipeline"
                if isinstance(found, str):
                    log.warning("a refused record cannot be dead-lettered: %s", found)
                    continue
                _request, refusal = found
                key = (tracker.pipeline, refusal.source)
                if self._refusals.get(key) != refusal:
                    log.warning(
                        "%s[%s] refused a record (%s): its request %s gets a dead letter "
                        "on the next try",
                        produced.topic(),
                        produced.partition(),
                        why,
                        refusal.source,
                    )
                    self._refusals[key] = refusal
                    learned += 1
        if learned:
            self._publish_views()
        return learned

    def _drop(self, served: Callable[[str, int, int], bool]) -> None:
        """Drop the refusals whose source is ``served(topic, partition, offset)``."""
        dropped = [key for key in self._refusals if served(*key[1])]
        for key in dropped:
            del self._refusals[key]
        if dropped:
            self._publish_views()

    def _publish_views(self) -> None:
        views: dict[str, dict[Source, Refusal]] = {}
        for (pipeline, source), refusal in self._refusals.items():
            views.setdefault(pipeline, {})[source] = refusal
        self._views = {name: MappingProxyType(view) for name, view in views.items()}
