"""This member's share of the group: the partitions it owns, and what a rebalance does to
the work in flight.

The callbacks run inside ``consume``, on the loop thread. On assign: the partitions are
owned (and their retention checked on the next turn). On revoke: buffered records of the
revoked partitions are dropped (never produced, so the next owner serves them without
duplicates), batches holding them get ``revoke_timeout_s`` to finish, and what finished
is committed synchronously, with every offset the broker has not confirmed. On lost:
dropped without a commit, since another member may own them already.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import cast

from confluent_kafka import Message, TopicPartition

from worker.core.clock import Clock
from worker.core.types import PartitionKey
from worker.delivery.mode import Delivery
from worker.errors import CommitError, SinkError
from worker.kafka.lag import LagStats
from worker.loop.batcher import Batcher
from worker.loop.pausing import PausingManager, describe_partitions
from worker.loop.threads import StageThreads
from worker.ops.health import HealthState
from worker.ops.metrics import Metrics

__all__ = ["Membership"]

log = logging.getLogger(__name__)


def _keys(partitions: Sequence[TopicPartition]) -> set[PartitionKey]:
    return {(tp.topic, tp.partition) for tp in partitions}


def _partition_of(msg: Message) -> PartitionKey:
    return cast(str, msg.topic()), cast(int, msg.partition())


class Membership:
    """Owned partitions and the rebalance callbacks; ``delivery`` is set once the
    delivery mode exists (it asks this for the owned partitions in turn)."""

    def __init__(
        self,
        *,
        batchers: Mapping[str, Batcher[Message]],
        threads: StageThreads,
        pausing: PausingManager,
        lag: LagStats,
        metrics: Metrics,
        health: HealthState,
        revoke_timeout_s: float,
        clock: Clock,
    ) -> None:
        self._batchers = batchers
        self._threads = threads
        self._pausing = pausing
        self._lag = lag
        self._metrics = metrics
        self._health = health
        self._revoke_timeout_s = revoke_timeout_s
        self._clock = clock
        self.delivery: Delivery | None = None
        self.assigned: set[PartitionKey] = set()
        self.assigned_at = 0.0
        self.commit_on_revoke = True
        """False once the worker failed: it leaves without waiting or committing."""
        self._unchecked: set[PartitionKey] = set()

    def take_unchecked(self) -> set[PartitionKey]:
        """Partitions assigned since the last call and still owned: their retention is
        checked outside the callback."""
        keys, self._unchecked = self._unchecked & self.assigned, set()
        return keys

    def on_assign(self, partitions: list[TopicPartition]) -> None:
        keys = _keys(partitions)
        self.assigned |= keys
        self._pausing.assigned(keys)
        self._unchecked |= keys
        self.assigned_at = self._clock()
        self._health.joined = True
        self._health.broker(True)
        self._metrics.rebalances.labels("assign").inc()
        self._metrics.assigned_partitions.set(len(self.assigned))
        log.info(
            "assigned %s; owning %d partitions", describe_partitions(partitions), len(self.assigned)
        )

    def on_revoke(self, partitions: list[TopicPartition]) -> None:
        keys = _keys(partitions)
        delivery, threads = self._delivery(), self._threads
        self._metrics.rebalances.labels("revoke").inc()
        dropped = sum(b.drop(keys, _partition_of) for b in self._batchers.values())
        if self.commit_on_revoke:
            deadline = time.monotonic() + self._revoke_timeout_s
            while threads.busy_with(keys) and time.monotonic() < deadline:
                delivery.serve(0.01)
            if threads.busy_with(keys):
                log.warning(
                    "revoke: batches of %s still running after %.0fs; the next owner "
                    "may repeat them",
                    describe_partitions(partitions),
                    self._revoke_timeout_s,
                )
            try:
                delivery.finish(deadline, at_least_s=0.1)
                delivery.commit(asynchronous=False)
            except (CommitError, SinkError) as exc:
                log.warning(
                    "commit on revoke failed, the next owner repeats those records: %s", exc
                )
        self._forget(keys)
        delivery.revoked(keys)
        log.info(
            "revoked %s (dropped %d buffered records)", describe_partitions(partitions), dropped
        )

    def on_lost(self, partitions: list[TopicPartition]) -> None:
        keys = _keys(partitions)
        self._metrics.rebalances.labels("lost").inc()
        dropped = sum(b.drop(keys, _partition_of) for b in self._batchers.values())
        self._forget(keys)
        self._delivery().lost(keys)
        log.warning(
            "lost %s (dropped %d buffered records)", describe_partitions(partitions), dropped
        )

    def _delivery(self) -> Delivery:
        assert self.delivery is not None, "a rebalance before the delivery mode was set"
        return self.delivery

    def _forget(self, keys: set[PartitionKey]) -> None:
        self.assigned -= keys
        self._pausing.forget(keys)
        self._lag.forget(keys)
        self._metrics.assigned_partitions.set(len(self.assigned))
