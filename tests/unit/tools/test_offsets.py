"""Pure parts of worker.tools.offsets: time and partition parsing, reset planning."""

from __future__ import annotations

from typing import cast

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from tests.fakes.offsets import FakeLookup
from worker.errors import ConfigError, SourceError
from worker.tools.offsets import (
    KafkaOffsets,
    ResetTarget,
    parse_partitions,
    parse_time,
    plan_reset,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1767225600000", 1_767_225_600_000),
        ("2026-01-01T00:00:00Z", 1_767_225_600_000),
        ("2026-01-01T00:00:00", 1_767_225_600_000),  # no zone: UTC
        ("2026-01-01T02:00:00+02:00", 1_767_225_600_000),
        ("2026-01-01T00:00:00.250Z", 1_767_225_600_250),
        ("2026-01-01", 1_767_225_600_000),
    ],
)
def test_parse_time(text: str, expected: int) -> None:
    assert parse_time(text) == expected


@pytest.mark.parametrize("text", ["yesterday", "", "-5", "2026-13-01"])
def test_parse_time_refuses_nonsense(text: str) -> None:
    with pytest.raises(ConfigError, match="not a time"):
        parse_time(text)


def test_parse_partitions() -> None:
    assert parse_partitions("3, 0,5-7,6") == [0, 3, 5, 6, 7]
    for bad in ("a", "3-1", ",", "-1"):
        with pytest.raises(ConfigError):
            parse_partitions(bad)


def test_plan_reset_earliest_latest_and_time() -> None:
    lookup = FakeLookup()
    assert plan_reset(lookup, ["t"], ResetTarget("earliest")) == {
        ("t", 0): 0,
        ("t", 1): 4,
        ("t", 2): 0,
    }
    assert plan_reset(lookup, ["t"], ResetTarget("latest")) == {
        ("t", 0): 10,
        ("t", 1): 6,
        ("t", 2): 0,
    }
    # First record at or after 4.5 s is offset 5; partition 1 starts at 5 too; a time
    # after every record goes to the log end.
    assert plan_reset(lookup, ["t"], ResetTarget("time", 4500)) == {
        ("t", 0): 5,
        ("t", 1): 5,
        ("t", 2): 0,
    }
    assert plan_reset(lookup, ["t"], ResetTarget("time", 60_000), [0]) == {("t", 0): 10}


def test_plan_reset_refuses_unknown_partitions_and_topics() -> None:
    with pytest.raises(ConfigError, match=r"no partitions \[7\]"):
        plan_reset(FakeLookup(), ["t"], ResetTarget("latest"), [0, 7])
    with pytest.raises(ConfigError, match="does not exist"):
        plan_reset(FakeLookup(), ["nope"], ResetTarget("latest"))


def test_reset_target_describes_itself() -> None:
    assert ResetTarget("time", 1_767_225_600_000).describe() == "time 2026-01-01T00:00:00Z"
    assert ResetTarget("earliest").describe() == "earliest"


class SettlingConsumer:
    """Answers ``committed`` with NOT_COORDINATOR ``refusals`` times first, as a fresh
    cluster's coordinator does for a new group."""

    def __init__(self, refusals: int, code: int = KafkaError.NOT_COORDINATOR) -> None:
        self.refusals, self.code, self.calls = refusals, code, 0

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        self.calls += 1
        if self.calls <= self.refusals:
            raise KafkaException(KafkaError(self.code))
        return [TopicPartition(tp.topic, tp.partition, 7) for tp in partitions]


def test_committed_asks_again_while_the_coordinator_settles() -> None:
    consumer = SettlingConsumer(refusals=2)
    offsets = KafkaOffsets(cast(Consumer, consumer))
    assert offsets.committed([("req", 0)]) == {("req", 0): 7}
    assert consumer.calls == 3


def test_committed_fails_at_once_on_other_errors() -> None:
    consumer = SettlingConsumer(refusals=1, code=KafkaError.GROUP_AUTHORIZATION_FAILED)
    with pytest.raises(SourceError, match="cannot read committed offsets"):
        KafkaOffsets(cast(Consumer, consumer)).committed([("req", 0)])
    assert consumer.calls == 1
