"""Group coverage: partitions no member of a settled group owns, and the rejoin that mends it.

A cooperative rebalance takes two rounds: in the first a member revokes what is to move,
and only its rejoin after the revoke starts the second round that hands those partitions
on. A static member (``group.instance.id``) that dies in between, say stuck in a
transactional call until ``CallWatch`` stops it, leaves them with nobody: its
replacement joins a Stable group under the same instance id and the coordinator hands
it the old member's current assignment without a rebalance (KIP-345), so no second
round ever comes. librdkafka has no ``enforceRebalance()``, and subscribing again to
the same topics is a no-op; what makes the coordinator rebalance is an unsubscribe and
subscribe (a LeaveGroup and a new join, measured on Kafka 4.1).

``GroupCoverage`` (a thread of its own) reads the group every ``interval_s`` through a
narrow ``GroupReader`` (the worker's: ``worker.kafka.group_reads``, an ``AdminGroupReader`` in a
child process, since librdkafka can abort the process in that admin call).
``CoverageCheck`` decides: a gap (partitions of the subscribed topics no member of a
Stable group owns) seen on two reads in a row is not a rebalance in flight; then the
member owning fewest partitions asks for a rejoin (it has the least to give up: one
owning none loses nothing), and on a third read in a row any member does, in case that
one is the member stuck. The rejoin itself happens on the loop
thread (``Source`` sees ``rejoin`` set), never here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from confluent_kafka import KafkaException

from worker.core import PartitionKey

__all__ = [
    "AdminGroupReader",
    "CoverageCheck",
    "GroupCoverage",
    "GroupReader",
    "GroupView",
    "unowned",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GroupView:
    """One read of the group: its state, each member's partitions (by group.instance.id,
    or member id for a dynamic member), and every partition of the subscribed topics."""

    stable: bool
    members: Mapping[str, frozenset[PartitionKey]]
    partitions: frozenset[PartitionKey]


class GroupReader(Protocol):
    """Reads the group; raises ``KafkaException`` (or ``OSError``) when it cannot."""

    def read(self) -> GroupView: ...

    def close(self) -> None: ...


def unowned(view: GroupView) -> frozenset[PartitionKey]:
    """Partitions no member owns; none while the group is rebalancing (not Stable)."""
    if not view.stable or not view.members:
        return frozenset()
    owned: set[PartitionKey] = set()
    for parts in view.members.values():
        owned |= parts
    return view.partitions - owned


@dataclass
class CoverageCheck:
    """Pure decision over successive reads: when this member (``me``) should rejoin."""

    streak: int = 0
    gap: frozenset[PartitionKey] = field(default_factory=frozenset)

    def observe(self, view: GroupView, me: str) -> frozenset[PartitionKey]:
        """The gap to mend now (rejoin), or an empty set. The same gap on two reads in a
        row makes the member owning fewest act; on three, any member."""
        gap = unowned(view)
        if not gap or me not in view.members:
            self.streak, self.gap = 0, frozenset()
            return frozenset()
        self.streak = self.streak + 1 if gap == self.gap else 1
        self.gap = gap
        fewest = min(len(p) for p in view.members.values())
        if self.streak >= 3 or (self.streak == 2 and len(view.members[me]) == fewest):
            self.streak, self.gap = 0, frozenset()
            return gap
        return frozenset()


class AdminGroupReader:
    """``GroupReader`` over an ``AdminClient``: ``describe_consumer_groups`` for the
    state and assignments, topic metadata for the partition counts."""

    def __init__(
        self, admin: Any, group_id: str, topics: Sequence[str], timeout_s: float = 10.0
    ) -> None:
        self._admin = admin
        self._group = group_id
        self._topics = [t for t in topics if not t.startswith("^")]  # patterns: not counted
        self._timeout_s = timeout_s

    def read(self) -> GroupView:
        futures = self._admin.describe_consumer_groups(
            [self._group], request_timeout=self._timeout_s
        )
        desc = futures[self._group].result(timeout=self._timeout_s)
        members = {
            m.group_instance_id or m.member_id: frozenset(
                (tp.topic, tp.partition)
                for tp in (m.assignment.topic_partitions if m.assignment else [])
            )
            for m in desc.members
        }
        partitions: set[PartitionKey] = set()
        for topic in self._topics:
            meta = self._admin.list_topics(topic=topic, timeout=self._timeout_s)
            info = meta.topics.get(topic)
            if info is None or info.error is not None:
                raise KafkaException(info.error if info is not None else f"no topic {topic}")
            partitions.update((topic, p) for p in info.partitions)
        return GroupView(
            stable=str(desc.state).rsplit(".", 1)[-1] == "STABLE",
            members=members,
            partitions=frozenset(partitions),
        )

    def close(self) -> None:
        """Nothing to release: the admin client goes with its last reference."""


class GroupCoverage:
    """A ``Background`` part: reads the group every ``interval_s`` and sets ``rejoin``
    when ``CoverageCheck`` says so for ``member`` (this worker's group.instance.id; the
    consumer itself is never touched here: its calls block while the loop thread is in
    ``consume``), after a warning naming the unowned partitions and
    a count in ``on_rejoin``. A read that fails is logged at debug and skipped."""

    def __init__(
        self,
        reader: GroupReader,
        *,
        member: str,
        rejoin: threading.Event,
        interval_s: float,
        on_rejoin: Callable[[], None] = lambda: None,
    ) -> None:
        self._reader = reader
        self._member = member
        self.rejoin = rejoin
        self._interval_s = interval_s
        self._on_rejoin = on_rejoin
        self._check = CoverageCheck()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="streamfer-coverage", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._reader.close()
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.check_once()

    def check_once(self) -> None:
        """One read and decision; never raises for a read that fails."""
        try:
            view = self._reader.read()
        except (KafkaException, OSError) as exc:
            log.debug("group coverage: could not read the group: %s", exc)
            return
        gap = self._check.observe(view, self._member)
        if gap:
            log.warning(
                "no member of the group owns %s (seen on consecutive checks of a Stable "
                "group); leaving and rejoining to make the group rebalance",
                ", ".join(f"{t}[{p}]" for t, p in sorted(gap)),
            )
            self._on_rejoin()
            self.rejoin.set()
