"""The chaos harness's recovery clock: seconds from a fault until every partition moved."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from benchmarks.served_again import END_WAIT_S, OffsetHistory, answered_after, read_ends


def history(*samples: tuple[float, dict[int, int], dict[int, int]]) -> OffsetHistory:
    h = OffsetHistory("127.0.0.1:1", "g", "t", 2)  # never started: no broker needed
    h._samples.extend(samples)
    return h


def test_served_again_when_every_partition_moved_past_where_it_stood() -> None:
    h = history(
        (99.0, {0: 5, 1: 5}, {0: 50, 1: 50}),
        (100.2, {0: 10, 1: 10}, {0: 60, 1: 60}),  # the baseline: first sample after the fault
        (101.0, {0: 20, 1: 10}, {0: 70, 1: 70}),  # partition 1 still where it stood
        (103.5, {0: 30, 1: 12}, {0: 80, 1: 80}),
    )
    assert h.after(100.0) == 3.5
    h._read_s[103.5] = 2.0
    assert h.sampling(100.0) == {"longest_gap_s": 2.5, "read_s": 2.0}, "103.5 - 101.0"
    h._consumer.close()


def test_caught_up_once_everything_written_before_the_fault_is_committed() -> None:
    h = history(
        (100.2, {0: 10, 1: 10}, {0: 60, 1: 40}),  # log ends at the fault: 60 and 40
        (101.0, {0: 20, 1: 11}, {0: 70, 1: 50}),  # both moved: served again, not caught up
        (109.0, {0: 60, 1: 30}, {0: 90, 1: 80}),
        (111.5, {0: 75, 1: 41}, {0: 95, 1: 85}),
    )
    assert h.after(100.0) == 1.0
    assert h.caught_up_after(100.0) == 11.5
    assert h.caught_up_after(200.0) is None
    h._consumer.close()


def test_a_partition_at_its_log_end_counts_as_served() -> None:
    h = history(
        (100.5, {0: 10, 1: 40}, {0: 60, 1: 40}),
        (101.5, {0: 11, 1: 40}, {0: 60, 1: 40}),
    )
    assert h.after(100.0) == 1.5
    h._consumer.close()


def test_never_served_while_sampling_is_none() -> None:
    h = history((100.5, {0: 10, 1: 10}, {0: 60, 1: 60}), (104.0, {0: 10, 1: 20}, {0: 60, 1: 60}))
    assert h.after(100.0) is None
    assert h.after(200.0) is None, "no sample after the fault"
    assert h.sampling(100.0) is None
    h._consumer.close()


def test_a_share_group_is_served_again_when_every_request_written_before_was_answered() -> None:
    written = {"0/0": 1_000, "0/1": 9_900, "1/0": 9_950, "1/1": 12_000}
    answered = {"0/0": [1_010], "0/1": [13_000, 25_000], "1/0": [14_500], "1/1": [12_020]}
    assert answered_after(10_000, written, answered) == 4.5, "the slowest first answer"
    assert answered_after(500, written, answered) == 0.0, "nothing was written before"


def test_a_request_never_answered_is_never_served() -> None:
    assert answered_after(10_000, {"0/0": 9_000}, {"0/1": [9_100]}) is None


class _Leaders:
    """Log ends by partition; a partition without one has a dead leader (the read fails)."""

    def __init__(self, ends: dict[int, int]) -> None:
        self.ends = ends
        self.waited: list[float] = []

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        self.waited.append(timeout)
        if partition.partition not in self.ends:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        return 0, self.ends[partition.partition]


def test_a_dead_leaders_partition_keeps_its_last_end_and_holds_no_sample() -> None:
    parts = [TopicPartition("t", 0), TopicPartition("t", 1)]
    known: dict[int, int] = {}
    assert read_ends(_Leaders({0: 10, 1: 20}), parts, known) == {0: 10, 1: 20}

    leaders = _Leaders({0: 15})  # partition 1's leader killed
    assert read_ends(leaders, parts, known) == {0: 15, 1: 20}
    assert leaders.waited == [END_WAIT_S, END_WAIT_S]
    assert END_WAIT_S <= 1.0


def test_a_partition_never_read_fails_the_sample() -> None:
    with pytest.raises(KafkaException):
        read_ends(_Leaders({0: 10}), [TopicPartition("t", 0), TopicPartition("t", 1)], {})
