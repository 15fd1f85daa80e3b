"""Source.consume_first: a lone record is returned at once, errors are filtered, and a
record whose partition is revoked or rewound while the rest is fetched is dropped; pin_starts
commits only what it can read and says which partitions the broker would not pin; and
the consumer settings the worker derives from its config."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from worker.config import KafkaSettings
from worker.core.types import PartitionKey
from worker.errors import MemberFenced, SourceError
from worker.kafka.source import Source, consumer_config, end_of_partition, fatal_error


class Record:
    def __init__(self, offset: int, error: KafkaError | None = None, partition: int = 0) -> None:
        self.offset = offset
        self._error = error
        self._partition = partition

    def error(self) -> KafkaError | None:
        return self._error

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return self._partition


class QueueConsumer:
    """What ``Source`` calls on a consumer, over a list of already fetched records."""

    def __init__(self, records: list[Record]) -> None:
        self.records = records
        self.calls: list[tuple[str, int, float]] = []
        self.callbacks: dict[str, Any] = {}
        self.revoke_in_consume: list[TopicPartition] = []
        self.in_consume: list[Any] = []
        """Calls made inside the next ``consume`` (a rewind served there)."""
        self.seeks: list[tuple[int, int]] = []

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self.callbacks = callbacks

    def poll(self, timeout: float) -> Record | None:
        self.calls.append(("poll", 1, timeout))
        return self.records.pop(0) if self.records else None

    def consume(self, num_messages: int, timeout: float) -> list[Record]:
        self.calls.append(("consume", num_messages, timeout))
        if self.revoke_in_consume:  # a rebalance served inside this call
            self.callbacks["on_revoke"](self, self.revoke_in_consume)
            self.records = [r for r in self.records if r.partition() != 0]
        while self.in_consume:
            self.in_consume.pop(0)()
        taken, self.records = self.records[:num_messages], self.records[num_messages:]
        return taken

    def seek(self, partition: TopicPartition) -> None:
        self.seeks.append((partition.partition, partition.offset))


@dataclass
class Listener:
    """Records the rebalances a ``Source`` tells it of."""

    assigned: list[list[TopicPartition]] = field(default_factory=list)
    revoked: list[list[TopicPartition]] = field(default_factory=list)
    lost: list[list[TopicPartition]] = field(default_factory=list)

    def on_assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned.append(partitions)

    def on_revoke(self, partitions: list[TopicPartition]) -> None:
        self.revoked.append(partitions)

    def on_lost(self, partitions: list[TopicPartition]) -> None:
        self.lost.append(partitions)


def source(
    records: list[Record], revoked: list[list[TopicPartition]] | None = None
) -> tuple[Source, QueueConsumer]:
    consumer = QueueConsumer(records)
    src = Source(cast(Consumer, consumer), ["t"])
    src.subscribe(Listener(revoked=revoked if revoked is not None else []))
    return src, consumer


def test_first_record_then_what_is_already_fetched_without_waiting() -> None:
    src, consumer = source([Record(i) for i in range(5)])
    got = src.consume_first(3, 0.5)
    assert [cast(Record, m).offset for m in got] == [0, 1, 2]
    assert consumer.calls == [("poll", 1, 0.5), ("consume", 2, 0)]


def test_nothing_within_the_timeout() -> None:
    src, consumer = source([])
    assert src.consume_first(256, 0.02) == []
    assert consumer.calls == [("poll", 1, 0.02)]


def test_partition_eof_is_dropped_and_fatal_errors_raise() -> None:
    eof = KafkaError(KafkaError._PARTITION_EOF)
    src, _ = source([Record(0, eof), Record(1)])
    assert [cast(Record, m).offset for m in src.consume_first(10, 0.1)] == [1]
    fatal = KafkaError(KafkaError._FATAL, "fenced", fatal=True)
    src, _ = source([Record(0, fatal)])
    with pytest.raises(SourceError, match="fatal consumer error"):
        src.consume_first(10, 0.1)


def test_a_fenced_static_member_is_told_apart_so_the_worker_starts_again_in_place() -> None:
    # librdkafka hands the fence over as _FATAL, the cause only in its text
    text = (
        "Fatal error: Broker: Static consumer fenced by other consumer with same "
        "group.instance.id: Fatal consumer error: Broker: Static consumer fenced by other "
        "consumer with same group.instance.id"
    )
    src, _ = source([Record(0, KafkaError(KafkaError._FATAL, text, fatal=True))])
    with pytest.raises(MemberFenced, match="session timeout") as raised:
        src.consume_first(10, 0.1)
    assert isinstance(raised.value, SourceError)
    assert isinstance(fatal_error(KafkaError(KafkaError.FENCED_INSTANCE_ID)), MemberFenced)
    other = fatal_error(KafkaError(KafkaError._FATAL, "unsupported feature", fatal=True))
    assert not isinstance(other, MemberFenced)


def test_first_record_of_a_partition_revoked_meanwhile_is_dropped() -> None:
    revoked: list[list[TopicPartition]] = []
    src, consumer = source([Record(0), Record(1, partition=1), Record(2)], revoked)
    consumer.revoke_in_consume = [TopicPartition("t", 0)]
    got = src.consume_first(10, 0.1)
    # record 0 was polled before partition 0 went; only partition 1's record is left
    assert [cast(Record, m).offset for m in got] == [1]
    assert [[(tp.topic, tp.partition) for tp in parts] for parts in revoked] == [[("t", 0)]]
    # a later call is not affected by the earlier revoke
    consumer.revoke_in_consume = []
    consumer.records = [Record(5, partition=1)]
    assert [cast(Record, m).offset for m in src.consume_first(10, 0.1)] == [5]


def test_first_record_of_a_partition_rewound_meanwhile_is_dropped() -> None:
    src, consumer = source([Record(3), Record(1, partition=1)])
    consumer.in_consume = [lambda: src.seek(TopicPartition("t", 0, 0))]
    got = src.consume_first(10, 0.1)
    # record 3 was polled before partition 0 was sought back to 0: fetched again later
    assert [cast(Record, m).offset for m in got] == [1]
    assert consumer.seeks == [(0, 0)]
    consumer.records = [Record(0), Record(1)]
    assert [cast(Record, m).offset for m in src.consume_first(10, 0.1)] == [0, 1]


def test_consumer_config_hears_of_rebalances_at_the_heartbeat_interval() -> None:
    settings = KafkaSettings(heartbeat_interval_ms=500)
    assert consumer_config(settings)["heartbeat.interval.ms"] == 500
    tuned = KafkaSettings(consumer_options={"heartbeat.interval.ms": 250})
    assert consumer_config(tuned)["heartbeat.interval.ms"] == 250, "consumer_options win"


# --- pin_starts --------------------------------------------------------------------


@dataclass
class Answered:
    """A partition of an answer with its own error (``TopicPartition.error`` is read-only)."""

    topic: str
    partition: int
    offset: int
    error: KafkaError | None = None


@dataclass
class GroupOffsets:
    """What ``pin_starts`` asks of a consumer: partitions of topic ``t`` with ``ends``
    records, none committed. ``committed`` answers the errors in ``unreadable``; each
    synchronous commit answers the partitions in ``refusals`` with their next error."""

    ends: dict[int, int]
    unreadable: dict[int, KafkaError] = field(default_factory=dict)
    refusals: dict[int, list[KafkaError]] = field(default_factory=dict)
    commits: list[list[tuple[int, int]]] = field(default_factory=list)
    group: dict[PartitionKey, int] = field(default_factory=dict)

    def consume(self, num_messages: int, timeout: float) -> list[Record]:
        return []

    def poll(self, timeout: float) -> Record | None:
        return None

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[Answered]:
        return [
            Answered(tp.topic, tp.partition, -1001, self.unreadable.get(tp.partition))
            for tp in partitions
        ]

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float, cached: bool = False
    ) -> tuple[int, int]:
        return 0, self.ends[partition.partition]

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> list[Answered]:
        assert not asynchronous
        self.commits.append([(tp.partition, tp.offset) for tp in offsets])
        answer = []
        for tp in offsets:
            queued = self.refusals.get(tp.partition)
            error = queued.pop(0) if queued else None
            if error is None:
                self.group[(tp.topic, tp.partition)] = tp.offset
            answer.append(Answered(tp.topic, tp.partition, tp.offset, error))
        return answer


def pinning(consumer: GroupOffsets) -> Source:
    return Source(cast(Consumer, consumer), ["t"], pin_latest=True)


def assigned(*partitions: int) -> list[TopicPartition]:
    return [TopicPartition("t", p) for p in partitions]


NOT_COORDINATOR = KafkaError(KafkaError.NOT_COORDINATOR)


def test_a_partition_the_broker_refuses_to_pin_is_tried_once_more(
    caplog: pytest.LogCaptureFixture,
) -> None:
    consumer = GroupOffsets({0: 5, 1: 7}, refusals={1: [NOT_COORDINATOR]})
    with caplog.at_level(logging.INFO, "worker.kafka.source"):
        pinning(consumer).pin_starts(assigned(0, 1))
    assert consumer.commits == [[(0, 5), (1, 7)], [(1, 7)]]
    assert consumer.group == {("t", 0): 5, ("t", 1): 7}
    assert "t[0]@5, t[1]@7" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_partition_refused_twice_is_named_and_not_said_to_be_pinned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    consumer = GroupOffsets({0: 5, 1: 7}, refusals={1: [NOT_COORDINATOR, NOT_COORDINATOR]})
    with caplog.at_level(logging.INFO, "worker.kafka.source"):
        pinning(consumer).pin_starts(assigned(0, 1))
    assert len(consumer.commits) == 2, "one retry, no more: the rebalance waits meanwhile"
    (pinned,) = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert "t[0]@5" in pinned and "t[1]" not in pinned
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "t[1]" in warning and "Not coordinator" in warning and "t[0]" not in warning


def test_a_refusal_that_a_retry_cannot_mend_is_not_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A new generation began: the rebalance cannot go on while the callback retries."""
    rebalancing = KafkaError(KafkaError.REBALANCE_IN_PROGRESS)
    consumer = GroupOffsets({0: 5}, refusals={0: [rebalancing, rebalancing]})
    pinning(consumer).pin_starts(assigned(0))
    assert consumer.commits == [[(0, 5)]]
    assert "t[0]" in caplog.text and "rebalance" in caplog.text.lower()


def test_a_partition_whose_committed_offset_cannot_be_read_is_not_pinned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its committed offset may well exist: pinning the log end over it would skip."""
    unstable = KafkaError(KafkaError.UNSTABLE_OFFSET_COMMIT)
    consumer = GroupOffsets({0: 5, 1: 7}, unreadable={1: unstable})
    pinning(consumer).pin_starts(assigned(0, 1))
    assert consumer.commits == [[(0, 5)]]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "t[1]" in warning and unstable.str() in warning


def test_a_rejoin_asked_for_leaves_and_subscribes_again_before_the_next_fetch() -> None:
    consumer = QueueConsumer([Record(0)])
    calls: list[str] = []
    consumer.unsubscribe = lambda: calls.append("unsubscribe")  # type: ignore[attr-defined]
    original = consumer.subscribe
    consumer.subscribe = lambda topics, **cb: (calls.append("subscribe"), original(topics, **cb))  # type: ignore[method-assign,assignment]
    rejoin = threading.Event()
    src = Source(cast(Consumer, consumer), ["t"], rejoin=rejoin)
    src.subscribe(Listener())
    src.consume(1, 0)
    assert calls == ["subscribe"]
    rejoin.set()
    src.consume_first(1, 0)
    assert calls == ["subscribe", "unsubscribe", "subscribe"]
    assert not rejoin.is_set()
    assert "on_revoke" in consumer.callbacks  # the callbacks are wired again


def test_the_consumer_protocol_leaves_the_group_settings_to_the_broker() -> None:
    settings = KafkaSettings(group_protocol="consumer")
    conf = consumer_config(settings)
    assert conf["group.protocol"] == "consumer"
    for moved in ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy"):
        assert moved not in conf
    consumer = Consumer(conf)  # librdkafka refuses any of them under this protocol
    consumer.close()


def test_the_classic_protocol_sets_its_group_settings() -> None:
    conf = consumer_config(KafkaSettings(session_timeout_ms=9000))
    assert "group.protocol" not in conf
    assert conf["partition.assignment.strategy"] == "cooperative-sticky"
    assert conf["session.timeout.ms"] == 9000
    Consumer(conf).close()


@pytest.mark.parametrize("assignor", ["roundrobin", "range"])
def test_the_classic_protocol_takes_a_one_round_assignor_when_asked(assignor: str) -> None:
    conf = consumer_config(KafkaSettings(assignor=assignor))  # type: ignore[arg-type]
    assert conf["partition.assignment.strategy"] == assignor
    Consumer(conf).close()  # librdkafka knows it


def test_a_member_offering_another_assignor_is_told_why_it_owns_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refused = KafkaError(
        KafkaError.INCONSISTENT_GROUP_PROTOCOL, "JoinGroup failed: Inconsistent group protocol"
    )
    with caplog.at_level(logging.WARNING):
        assert not end_of_partition(refused)
    assert "offer another assignor ([kafka] assignor)" in caplog.text


def test_a_fatal_event_stops_the_worker_and_says_what_a_restart_waits_for() -> None:
    """librdkafka hands a fatal error over as a ``_FATAL`` event whose ``fatal()`` is
    false, the cause only in its text (a refused group_instance_id under KIP-848)."""
    event = KafkaError(
        KafkaError._FATAL,
        "Fatal error: Broker: The instance ID is still used by another member in the "
        "consumer group",
    )
    src, _ = source([Record(0, event), Record(1)])
    with pytest.raises(SourceError) as stopped:
        src.consume_first(10, 0.1)
    assert "still used" in str(stopped.value)
    assert "group.consumer.session.timeout.ms" in str(stopped.value)
