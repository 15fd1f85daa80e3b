"""A static member killed between its revoke and its rejoin orphans partitions; the
group coverage check makes the group serve them again (real Kafka)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.conftest import Topics
from worker.config import KafkaSettings
from worker.kafka.group_coverage import GroupCoverage, GroupView, unowned
from worker.kafka.group_reads import ChildGroupReader, child_settings
from worker.kafka.source import Source

# A static member: prints its partitions after each assignment; stops polling once it
# owns FREEZE_AT of them (stuck, as in send_offsets_to_transaction).
MEMBER = """
import sys
from confluent_kafka import Consumer
boot, topic, group, freeze_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
c = Consumer({"bootstrap.servers": boot, "group.id": group, "group.instance.id": "a",
    "partition.assignment.strategy": "cooperative-sticky", "session.timeout.ms": 10000,
    "heartbeat.interval.ms": 500, "enable.auto.commit": False})
owned = set()
def assigned(_c, parts):
    owned.update(p.partition for p in parts); print(sorted(owned), flush=True)
c.subscribe([topic], on_assign=assigned)
while len(owned) != freeze_at:
    c.poll(0.1)
import time; time.sleep(3600)
"""


def spawn(bootstrap: str, topics: Topics, freeze_at: int) -> subprocess.Popen[str]:
    argv = [sys.executable, "-c", MEMBER, bootstrap, topics.requests, topics.group]
    return subprocess.Popen([*argv, str(freeze_at)], stdout=subprocess.PIPE, text=True)


@pytest.fixture
def member_a(kafka_bootstrap: str) -> Iterator[Callable[[Topics, int], subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []

    def start(topics: Topics, freeze_at: int) -> subprocess.Popen[str]:
        started.append(spawn(kafka_bootstrap, topics, freeze_at))
        return started[-1]

    yield start
    for proc in started:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


class Owned:
    """Keeps ``partitions`` to what the group assigned this member."""

    def __init__(self, partitions: set[int]) -> None:
        self.partitions = partitions

    def on_assign(self, parts: list[TopicPartition]) -> None:
        self.partitions.update(p.partition for p in parts)

    def on_revoke(self, parts: list[TopicPartition]) -> None:
        self.partitions.difference_update(p.partition for p in parts)

    def on_lost(self, parts: list[TopicPartition]) -> None:
        self.partitions.difference_update(p.partition for p in parts)


def wait_for(what: Callable[[], bool], serve: Callable[[], Any], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return True
        serve()
    return what()


def owners(view: GroupView) -> list[list[int]]:
    return sorted(sorted(p for _t, p in parts) for parts in view.members.values())


def test_partitions_orphaned_by_a_static_replacement_are_served_again(
    kafka_bootstrap: str,
    fresh_topics: Callable[..., Topics],
    member_a: Callable[[Topics, int], subprocess.Popen[str]],
) -> None:
    topics = fresh_topics(4)
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, group_id=topics.group)
    reader = ChildGroupReader(child_settings(settings, [topics.requests]))
    first = member_a(topics, 4)  # owns all four, then never polls again
    assert first.stdout is not None and first.stdout.readline().strip() == "[0, 1, 2, 3]"

    owned: set[int] = set()
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": topics.group,
            "group.instance.id": "b",
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": 10000,
            "heartbeat.interval.ms": 500,
            "enable.auto.commit": False,
        }
    )
    rejoin = threading.Event()
    source = Source(consumer, [topics.requests], rejoin=rejoin)
    source.subscribe(Owned(owned))

    def serve() -> None:
        source.consume(10, 0.2)

    try:
        # Round 1: a keeps [2, 3] and must revoke [0, 1], but never polls to do so.
        def round_one() -> bool:
            return owners(reader.read()) == [[], [2, 3]]

        assert wait_for(round_one, serve, 30)
        first.kill()
        first.wait()
        # Its static replacement takes a's current assignment, without a rebalance.
        second = member_a(topics, -1)
        assert second.stdout is not None and second.stdout.readline().strip() == "[2, 3]"
        for _ in range(10):  # the gap stays: nobody asks for a second round
            serve()
        view = reader.read()
        assert view.stable and unowned(view) == {(topics.requests, 0), (topics.requests, 1)}

        coverage = GroupCoverage(reader, member="b", rejoin=rejoin, interval_s=1.0)
        coverage.start()
        try:
            assert wait_for(lambda: owned == {0, 1}, serve, 20), owned
        finally:
            assert coverage.stop(5.0)
        assert wait_for(lambda: not unowned(reader.read()), serve, 10)
    finally:
        consumer.close()
        reader.close()


def test_a_covered_group_is_left_alone(
    kafka_bootstrap: str, fresh_topics: Callable[..., Topics]
) -> None:
    topics = fresh_topics(2)
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, group_id=topics.group)
    reader = ChildGroupReader(child_settings(settings, [topics.requests]))
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": topics.group,
            "group.instance.id": "b",
            "partition.assignment.strategy": "cooperative-sticky",
            "enable.auto.commit": False,
        }
    )
    rejoin = threading.Event()
    owned: set[int] = set()
    source = Source(consumer, [topics.requests], rejoin=rejoin)
    source.subscribe(Owned(owned))
    try:
        assert wait_for(lambda: owned == {0, 1}, lambda: source.consume(10, 0.2), 30)
        coverage = GroupCoverage(reader, member="b", rejoin=rejoin, interval_s=0)
        for _ in range(4):
            coverage.check_once()
        assert not rejoin.is_set()
    finally:
        consumer.close()
        reader.close()
