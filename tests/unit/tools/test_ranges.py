"""worker.tools.ranges: bounds resolved into one range per partition against a fake log."""

from __future__ import annotations

import pytest

from tests.fakes.offsets import FakeLookup
from worker.errors import ConfigError
from worker.tools.ranges import (
    Bounds,
    OffsetBound,
    PartitionRange,
    parse_offset_bound,
    resolve_ranges,
)


def test_parse_offset_bound() -> None:
    assert parse_offset_bound("500") == OffsetBound(500, {})
    assert parse_offset_bound("0:10, 3:7") == OffsetBound(None, {0: 10, 3: 7})
    assert parse_offset_bound("5,1:9").for_partition(1) == 9
    assert parse_offset_bound("5,1:9").for_partition(2) == 5
    for bad in ("x", "1:x", "-3", ""):
        with pytest.raises(ConfigError):
            parse_offset_bound(bad)


def test_whole_topic_is_log_start_to_log_end_now() -> None:
    assert resolve_ranges(FakeLookup(), ["t"], Bounds()) == [
        PartitionRange("t", 0, 0, 10),
        PartitionRange("t", 1, 4, 6),
        PartitionRange("t", 2, 0, 0),
    ]


def test_time_bounds_are_start_inclusive_end_exclusive() -> None:
    # timestamps are 1000 * offset: [2.0 s, 7.5 s) holds offsets 2..7
    ranges = resolve_ranges(FakeLookup(), ["t"], Bounds(from_time_ms=2000, to_time_ms=7500))
    assert [(r.start, r.end) for r in ranges] == [(2, 8), (4, 6), (0, 0)]
    # a start after every record is an empty range at the log end
    ranges = resolve_ranges(FakeLookup(), ["t"], Bounds(from_time_ms=9_000_000))
    assert [(r.start, r.end) for r in ranges] == [(10, 10), (6, 6), (0, 0)]


def test_offset_bounds_are_clamped_to_the_log_and_partitions_filter() -> None:
    bounds = Bounds(
        from_offset=OffsetBound(1, {1: 0}),
        to_offset=OffsetBound(None, {0: 50, 1: 5}),
        partitions=(0, 1),
    )
    ranges = resolve_ranges(FakeLookup(), ["t"], bounds)
    assert ranges == [PartitionRange("t", 0, 1, 10), PartitionRange("t", 1, 4, 5)]
    assert sum(r.span for r in ranges) == 10
    backwards = Bounds(from_offset=OffsetBound(8), to_offset=OffsetBound(3))
    assert resolve_ranges(FakeLookup(), ["t"], backwards)[0] == PartitionRange("t", 0, 8, 8)


def test_bounds_that_cannot_be_met_are_refused() -> None:
    with pytest.raises(ConfigError, match="no partitions"):
        resolve_ranges(FakeLookup(), ["t"], Bounds(partitions=(9,)))
    with pytest.raises(ConfigError, match="not replayed"):
        resolve_ranges(
            FakeLookup(), ["t"], Bounds(partitions=(0,), to_offset=OffsetBound(None, {2: 1}))
        )
    with pytest.raises(ConfigError, match="not both"):
        resolve_ranges(FakeLookup(), ["t"], Bounds(from_time_ms=1, from_offset=OffsetBound(1)))
