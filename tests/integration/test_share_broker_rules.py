"""What Apache Kafka 4.4's share groups do at the record lock and the delivery limit,
which the share loop relies on (``worker.loop.share_group``), shown with confluent-
kafka's own share consumer: a release or a lock that runs out delivers a record again
one count higher, and archives it on its last delivery; a member that closes holding a
record counts its delivery all the same; a member that held a poll past
``max.poll.interval.ms`` keeps the acknowledgements it sends after; and a record whose
lock ran out is another member's, whatever the first one makes of it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import AcknowledgeType, Message, Producer, ShareConsumer

from tests.integration.test_share_groups import set_group_configs
from worker.kafka.share_source import ShareSource
from worker.kafka.topics import ensure_topics

pytestmark = pytest.mark.integration

LOCK_MS = 2000
"""The groups' record lock: the broker's minimum here is 1 s (``start_kafka``)."""


class Group:
    """A fresh topic of one partition and a share group on it, its members made here."""

    def __init__(self, bootstrap: str, limit: int) -> None:
        tag = uuid.uuid4().hex[:10]
        self.bootstrap, self.topic, self.group = bootstrap, f"share-{tag}", f"group-{tag}"
        ensure_topics(bootstrap, [(self.topic, 1)])
        set_group_configs(
            bootstrap,
            self.group,
            share_auto_offset_reset="earliest",
            share_delivery_count_limit=str(limit),
            share_record_lock_duration_ms=str(LOCK_MS),
        )
        self.members: list[ShareConsumer] = []

    def member(self, **conf: object) -> ShareConsumer:
        consumer = ShareConsumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group,
                "share.acknowledgement.mode": "explicit",
                **conf,
            }
        )
        consumer.subscribe([self.topic])
        self.members.append(consumer)
        return consumer

    def close(self, consumer: ShareConsumer) -> None:
        self.members.remove(consumer)
        consumer.close()


@pytest.fixture
def share_group(kafka_bootstrap: str) -> Iterator[Callable[[int], Group]]:
    made: list[Group] = []

    def make(limit: int) -> Group:
        made.append(Group(kafka_bootstrap, limit))
        return made[-1]

    yield make
    for group in made:
        for consumer in list(group.members):
            group.close(consumer)


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in values:
        producer.produce(topic, value)
    assert producer.flush(30) == 0


def take(consumer: ShareConsumer, timeout: float = 30.0) -> list[tuple[int, int]]:
    """The (offset, delivery count) of the next records the member acquires; [] if none
    comes within ``timeout``."""
    return [(m.offset() or 0, m.delivery_count() or 0) for m in take_messages(consumer, timeout)]


def take_messages(consumer: ShareConsumer, timeout: float = 30.0) -> list[Message]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = [m for m in consumer.poll(0.5) if m.error() is None]
        if got:
            return got
    return []


def acknowledge(consumer: ShareConsumer, messages: list[Message], kind: AcknowledgeType) -> None:
    for msg in messages:
        consumer.acknowledge(msg, kind)


def refused(consumer: ShareConsumer) -> list[str]:
    answer = consumer.commit_sync(10)
    return [str(err) for err in answer.values() if err is not None]


NOTHING_S = 3 * LOCK_MS / 1000
"""Long enough for an archived record to have come back, were it not archived."""


def test_a_release_counts_a_delivery_and_a_release_on_the_last_archives(
    share_group: Callable[[int], Group],
) -> None:
    group = share_group(2)
    produce(group.bootstrap, group.topic, [b"a", b"b"])
    first = group.member()
    got = take_messages(first)
    assert [(m.offset(), m.delivery_count()) for m in got] == [(0, 1), (1, 1)]
    acknowledge(first, got, AcknowledgeType.RELEASE)
    assert refused(first) == []
    again = take_messages(first)
    assert [(m.offset(), m.delivery_count()) for m in again] == [(0, 2), (1, 2)]
    acknowledge(first, again, AcknowledgeType.RELEASE)
    assert refused(first) == []
    assert take(first, NOTHING_S) == []


def test_a_lock_that_runs_out_delivers_again_and_refuses_the_late_acceptance(
    share_group: Callable[[int], Group],
) -> None:
    group = share_group(3)
    produce(group.bootstrap, group.topic, [b"a"])
    first = group.member()
    got = take_messages(first)
    assert [(m.offset(), m.delivery_count()) for m in got] == [(0, 1)]
    time.sleep(LOCK_MS / 1000 * 2)  # the lock runs out: the record is available again
    acknowledge(first, got, AcknowledgeType.ACCEPT)
    answer = refused(first)
    assert len(answer) == 1 and "INVALID_RECORD_STATE" in answer[0], answer
    assert take(first) == [(0, 2)]


def test_a_lock_that_runs_out_on_the_last_delivery_archives_the_record(
    share_group: Callable[[int], Group],
) -> None:
    """On its last delivery a record whose lock runs out is archived: no one gets it
    again, and the late acceptance is not even refused (the broker has moved past it),
    so only what the member that held it produces tells what became of it."""
    group = share_group(2)
    produce(group.bootstrap, group.topic, [b"a", b"b"])
    first = group.member()
    got = take_messages(first)
    acknowledge(first, got, AcknowledgeType.RELEASE)
    assert refused(first) == []
    last = take_messages(first)
    assert [(m.offset(), m.delivery_count()) for m in last] == [(0, 2), (1, 2)]
    time.sleep(LOCK_MS / 1000 * 2)
    acknowledge(first, last, AcknowledgeType.ACCEPT)
    assert refused(first) == []
    assert take(group.member(), NOTHING_S) == []
    assert take(first, 1.0) == []


def test_a_member_that_closes_holding_records_counts_their_delivery(
    share_group: Callable[[int], Group],
) -> None:
    """Leaving the group does not hand a record back uncounted: a member that closes
    (or stops) holding a record on its last delivery has it archived. A worker cannot
    give such a record back for another try; it must deliver its outcome itself."""
    group = share_group(2)
    produce(group.bootstrap, group.topic, [b"a"])
    first = group.member()
    assert take(first) == [(0, 1)]
    group.close(first)
    second = group.member()
    assert take(second) == [(0, 2)]
    group.close(second)
    assert take(group.member(), NOTHING_S) == []


def test_a_member_past_the_poll_interval_keeps_its_acknowledgements(
    share_group: Callable[[int], Group],
) -> None:
    """A member that holds a poll past ``max.poll.interval.ms`` (a model fault hold, a
    Redis wait) leaves the group, yet the broker takes the acceptances it sends after
    and gives the records to no other member, though one polls all along and the lock
    runs out meanwhile; its next poll raises ``_MAX_POLL_EXCEEDED``, which
    ``ShareSource.poll`` answers with no records, and the one after joins again."""
    group = share_group(5)
    slow = group.member(**{"max.poll.interval.ms": 1000})
    take(slow, 10)  # joined
    other = group.member()
    produce(group.bootstrap, group.topic, [b"a", b"b", b"c"])
    got = take_messages(slow)
    assert [m.offset() for m in got] == [0, 1, 2]
    time.sleep(1.5)  # past the poll interval, within the lock
    acknowledge(slow, got, AcknowledgeType.ACCEPT)
    assert refused(slow) == []
    source = ShareSource(slow, [group.topic])
    assert source.poll(1.0) == []  # librdkafka raised _MAX_POLL_EXCEEDED here
    assert take(other, 2 * LOCK_MS / 1000) == []
    produce(group.bootstrap, group.topic, [b"d"])
    later: list[tuple[int, int]] = []
    deadline = time.monotonic() + 30
    while not later and time.monotonic() < deadline:
        later = [(m.offset() or 0, m.delivery_count() or 0) for m in source.poll(0.5)]
        later = later or take(other, 0.5)
    assert later == [(3, 1)]


def test_a_lock_that_runs_out_before_the_last_delivery_hands_the_record_on(
    share_group: Callable[[int], Group],
) -> None:
    """Delivery limit - 1: the member holding the record past its lock loses it to
    another member, which gets it on the group's last delivery (where a worker
    dead-letters it unprocessed), and the first member's late acceptance is refused.
    Both members' outcomes would stand: so the share loop produces nothing of a batch
    whose lock ran out (``LockGate``)."""
    group = share_group(3)
    produce(group.bootstrap, group.topic, [b"a"])
    first = group.member()
    got = take_messages(first)
    acknowledge(first, got, AcknowledgeType.RELEASE)
    assert refused(first) == []
    held = take_messages(first)
    assert [(m.offset(), m.delivery_count()) for m in held] == [(0, 2)]
    other = group.member()
    assert take(other) == [(0, 3)]  # the lock ran out while ``first`` held it
    acknowledge(first, held, AcknowledgeType.ACCEPT)
    answer = refused(first)
    assert len(answer) == 1 and "INVALID_RECORD_STATE" in answer[0], answer
