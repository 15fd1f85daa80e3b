"""A closed batch's job: the offsets it completes and its records per partition."""

from __future__ import annotations

from confluent_kafka import Message

from worker.core import DeliveryTracker, Job


def _record(topic: str, partition: int, offset: int, ts: int = 1_700_000_000_000) -> Message:
    return Message(topic=topic, partition=partition, offset=offset, value=b"{}", timestamp=(1, ts))


def test_a_job_completes_the_last_offset_of_each_partition_and_counts_its_records() -> None:
    batch = [
        _record("a", 0, 10),
        _record("a", 1, 5),
        _record("b", 0, 7),
        _record("a", 0, 11),
        _record("a", 1, 6),
        _record("a", 0, 12),
    ]
    made: list[tuple[str, int]] = []

    def tracker(pipeline: str, ts: int) -> DeliveryTracker:
        made.append((pipeline, ts))
        return DeliveryTracker(pipeline)

    job = Job.close("p", batch, tracker)
    assert job.offsets == {("a", 0): 13, ("a", 1): 7, ("b", 0): 8}
    assert job.counts == {("a", 0): 3, ("a", 1): 2, ("b", 0): 1}
    assert job.records == 6
    assert made == [("p", 1_700_000_000_000)]


def test_a_batch_whose_first_record_has_no_timestamp_starts_its_tracker_at_zero() -> None:
    job = Job.close("p", [_record("a", 0, 0, ts=-1)], lambda p, ts: DeliveryTracker(p, ts))
    assert job.tracker.oldest_ts_ms == 0
    assert (job.offsets, job.counts) == ({("a", 0): 1}, {("a", 0): 1})
