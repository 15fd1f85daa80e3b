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
from collections.abc import Mapping, Sequence
from typing import cast

from confluent_kafka import Message, TopicPartition

from worker.core import Assignment, Clock, Deadline, PartitionKey
from worker.delivery import Delivery
from worker.errors import CommitError, SinkError
from worker.kafka import LagStats
from worker.loop.batcher import Batcher
from worker.loop.metrics import LoopFamilies
from worker.loop.pausing import PausingManager, describe_partitions
from worker.loop.threads import StageThreads
from worker.ops import HealthState

__all__ = ["Membership"]

log = logging.getLogger(__name__)


def _keys(partitions: Sequence[TopicPartition]) -> set[PartitionKey]:
    return {(tp.topic, tp.partition) for tp in partitions}


def _partition_of(msg: Message) -> PartitionKey:
    return cast(str, msg.topic()), cast(int, msg.partition())


class Membership:
    """The rebalance callbacks (a ``RebalanceListener``): they keep ``owned`` true, and
    finish, commit or drop the work of the partitions that leave."""

    def __init__(
        self,
        *,
        owned: Assignment,
        delivery: Delivery,
        batchers: Mapping[str, Batcher[Message]],
        threads: StageThreads,
        pausing: PausingManager,
        lag: LagStats,
        metrics: LoopFamilies,
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
        self._owned = owned
        self._delivery = delivery
        self.commit_on_revoke = True
        """False once the worker failed: it leaves without waiting or committing."""
        self._unchecked: set[PartitionKey] = set()

    def take_unchecked(self) -> set[PartitionKey]:
        """Partitions assigned since the last call and still owned: their retention is
        checked outside the callback."""
        keys, self._unchecked = self._unchecked & self._owned.partitions, set()
        return keys

    def on_assign(self, partitions: list[TopicPartition]) -> None:
        keys, owned = _keys(partitions), self._owned
        owned.partitions |= keys
        self._pausing.assigned(keys)
        self._unchecked |= keys
        owned.since = self._clock()
        self._health.joined = True
        self._health.broker(True)
        self._metrics.rebalances.labels("assign").inc()
        self._metrics.assigned_partitions.set(len(owned.partitions))
        log.info(
            "assigned %s; owning %d partitions",
            describe_partitions(partitions),
            len(owned.partitions),
        )

    def on_revoke(self, partitions: list[TopicPartition]) -> None:
        keys = _keys(partitions)
        delivery, threads = self._delivery, self._threads
        self._metrics.rebalances.labels("revoke").inc()
        dropped = sum(b.drop(keys, _partition_of) for b in self._batchers.values())
        if self.commit_on_revoke:
            deadline = Deadline.after(self._revoke_timeout_s)
            deadline.wait(lambda: not threads.busy_with(keys), lambda: delivery.serve(0.01))
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
        self._delivery.lost(keys)
        log.warning(
            "lost %s (dropped %d buffered records)", describe_partitions(partitions), dropped
        )

    def _forget(self, keys: set[PartitionKey]) -> None:
        owned = self._owned.partitions
        owned -= keys
        self._pausing.forget(keys)
        self._lag.forget(keys)
        self._metrics.assigned_partitions.set(len(owned))
