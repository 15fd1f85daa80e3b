"""A batch in flight: the one record that carries a closed batch from the consumer,
through the processing stages, to the committer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Message

from worker.core.tracker import DeliveryTracker
from worker.core.types import PartitionKey

__all__ = ["Job", "next_offsets"]


@dataclass(slots=True)
class Job:
    """One closed batch of one pipeline: its records, the offsets it completes, how many
    records it holds per partition, and where its deliveries are tracked (with the
    first record's timestamp, for end-to-end latency)."""

    pipeline: str
    batch: list[Message]
    tracker: DeliveryTracker
    offsets: dict[PartitionKey, int]
    """The next offset per partition (last + 1): what commits once the batch is done."""
    counts: dict[PartitionKey, int] = field(default_factory=dict)
    """Records per partition, counted against the worker's bound until committed; a
    revoke takes its partitions out (of this and of ``offsets``)."""
    rewinds: int = 0
    """The worker's exactly-once rewind count when the job was submitted."""
    records: int = field(init=False, default=0)
    """Records counted against the bound, fixed when the batch closed: a batch still
    running after a revoke counts until it is done."""

    def __post_init__(self) -> None:
        self.records = sum(self.counts.values())

    @classmethod
    def close(
        cls,
        pipeline: str,
        batch: list[Message],
        tracker: Callable[[str, int], DeliveryTracker],
    ) -> Job:
        """The job of a closed batch; ``tracker(pipeline, first_timestamp_ms)`` makes its
        delivery tracker (0: the record has no timestamp)."""
        ts = batch[0].timestamp()[1]
        offsets, counts = _offsets_and_counts(batch)
        return cls(pipeline, batch, tracker(pipeline, ts if ts > 0 else 0), offsets, counts)


def next_offsets(batch: Sequence[Message]) -> dict[PartitionKey, int]:
    """The offset to commit per partition once ``batch`` is done: last offset + 1."""
    return _offsets_and_counts(batch)[0]


def _offsets_and_counts(
    batch: Sequence[Message],
) -> tuple[dict[PartitionKey, int], dict[PartitionKey, int]]:
    """``next_offsets`` of ``batch`` and its records per partition (what a revoke of one
    partition takes off the worker's count in flight), in one pass: the loop thread
    closes every batch, so each record is read once."""
    last: dict[Any, int] = {}
    counts: dict[Any, int] = {}
    get = counts.get
    for msg in batch:
        key = (msg.topic(), msg.partition())
        last[key] = msg.offset()  # type: ignore[assignment]
        counts[key] = get(key, 0) + 1
    return {key: offset + 1 for key, offset in last.items()}, counts
