"""Offset ranges: bounds (times, offsets, partitions, or nothing: the whole log) resolved
into one ``[start, end)`` range per partition, against what the log holds when asked.

``streamfer replay`` reads the ranges it resolves; ``streamfer offsets reset`` moves a
group to where such a range starts (to the earliest offset or a time) or ends (to the
latest), so both refuse the same bounds with the same words. ``OffsetLookup`` is all
they ask of the cluster (``worker.tools.offsets.KafkaOffsets``, or a fake in tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from worker.core import PartitionKey
from worker.errors import ConfigError

__all__ = [
    "Bounds",
    "OffsetBound",
    "OffsetLookup",
    "PartitionRange",
    "parse_offset_bound",
    "resolve_ranges",
]


class OffsetLookup(Protocol):
    """What bound resolution needs to know about a topic (``KafkaOffsets``, or a fake)."""

    def partitions(self, topic: str) -> list[int]:
        """The topic's partition ids. Raises ``ConfigError`` if it does not exist."""
        ...

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        """(log start, log end): the first offset kept and the next offset to be written."""
        ...

    def offsets_for_time(
        self, topic: str, partitions: Sequence[int], time_ms: int
    ) -> dict[int, int | None]:
        """Per partition, the first offset whose timestamp is at or after ``time_ms``;
        None when every record is older."""
        ...


@dataclass(frozen=True, slots=True)
class OffsetBound:
    """An offset for every partition (``default``) and/or for named ones."""

    default: int | None = None
    by_partition: dict[int, int] = field(default_factory=dict)

    def for_partition(self, partition: int) -> int | None:
        return self.by_partition.get(partition, self.default)


def parse_offset_bound(text: str) -> OffsetBound:
    """``"500"`` (every partition) or ``"0:500,3:120"`` (partition:offset pairs)."""
    default: int | None = None
    pairs: dict[int, int] = {}
    try:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            if ":" in part:
                p, o = part.split(":", 1)
                pairs[int(p)] = int(o)
            else:
                default = int(part)
    except ValueError:
        raise ConfigError(f"not an offset bound: {text!r} (use 500 or 0:500,3:120)") from None
    if default is None and not pairs:
        raise ConfigError(f"no offsets in {text!r}")
    if (default is not None and default < 0) or any(p < 0 or o < 0 for p, o in pairs.items()):
        raise ConfigError(f"offsets and partitions must not be negative: {text!r}")
    return OffsetBound(default, pairs)


@dataclass(frozen=True, slots=True)
class Bounds:
    """What to replay. Starts are inclusive, ends exclusive: ``[from, to)`` in offsets, and
    in time the records whose timestamp is at or after ``from_time_ms`` and before
    ``to_time_ms`` (resolved per partition with ``offsets_for_times``, so a partition whose
    timestamps go backwards is cut where its first record at or after the time sits)."""

    from_time_ms: int | None = None
    to_time_ms: int | None = None
    from_offset: OffsetBound | None = None
    to_offset: OffsetBound | None = None
    partitions: tuple[int, ...] | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "from_time_ms": self.from_time_ms,
            "to_time_ms": self.to_time_ms,
            "from_offset": None if self.from_offset is None else asdict(self.from_offset),
            "to_offset": None if self.to_offset is None else asdict(self.to_offset),
            "partitions": None if self.partitions is None else list(self.partitions),
        }


@dataclass(frozen=True, slots=True)
class PartitionRange:
    """Offsets ``[start, end)`` of one partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def key(self) -> PartitionKey:
        return (self.topic, self.partition)

    @property
    def span(self) -> int:
        """Offsets in the range: the records, less transaction markers and compacted ones."""
        return max(0, self.end - self.start)


def resolve_ranges(
    lookup: OffsetLookup, topics: Sequence[str], bounds: Bounds
) -> list[PartitionRange]:
    """One range per partition, clamped to what the log holds now. Ends are the log end
    at this moment at most, so records written later are never part of the replay."""
    if bounds.from_time_ms is not None and bounds.from_offset is not None:
        raise ConfigError("give --from-time or --from-offset, not both")
    if bounds.to_time_ms is not None and bounds.to_offset is not None:
        raise ConfigError("give --to-time or --to-offset, not both")
    ranges: list[PartitionRange] = []
    for topic in topics:
        ids = lookup.partitions(topic)
        if bounds.partitions is not None:
            missing = sorted(set(bounds.partitions) - set(ids))
            if missing:
                raise ConfigError(f"topic {topic!r} has no partitions {missing}")
            ids = sorted(bounds.partitions)
        for bound in (bounds.from_offset, bounds.to_offset):
            if bound is not None:
                unknown = sorted(set(bound.by_partition) - set(ids))
                if unknown:
                    raise ConfigError(f"offset bound names partitions {unknown} not replayed")
        marks = {p: lookup.watermarks(topic, p) for p in ids}
        from_ms, to_ms = bounds.from_time_ms, bounds.to_time_ms
        starts = None if from_ms is None else lookup.offsets_for_time(topic, ids, from_ms)
        ends = None if to_ms is None else lookup.offsets_for_time(topic, ids, to_ms)
        for p in ids:
            low, high = marks[p]
            start = _bound_offset(p, starts, bounds.from_offset, default=low, high=high)
            end = _bound_offset(p, ends, bounds.to_offset, default=high, high=high)
            start = min(max(start, low), high)
            end = min(max(end, start), high)
            ranges.append(PartitionRange(topic, p, start, end))
    return ranges


def _bound_offset(
    partition: int,
    by_time: dict[int, int | None] | None,
    by_offset: OffsetBound | None,
    *,
    default: int,
    high: int,
) -> int:
    """One end of a partition's range: from a time lookup (no record at or after the time
    means the log end), else from an offset bound, else ``default``."""
    if by_time is not None:
        at = by_time.get(partition)
        return high if at is None else at
    if by_offset is not None:
        given = by_offset.for_partition(partition)
        return default if given is None else given
    return default
