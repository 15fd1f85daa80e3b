"""What an aborted transaction teaches the next try: refusals by pipeline and source,
and a bound on failures in a row that taught nothing."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, Message

from worker.core.job import Job
from worker.core.tracker import DeliveryTracker
from worker.core.types import Refusal
from worker.delivery.transaction_tries import TransactionTries
from worker.errors import SinkError

REFUSED = KafkaError(KafkaError.INVALID_RECORD, "compacted topic needs a key")


def locate(tracker: DeliveryTracker, produced: Message, why: str) -> tuple[Message, Refusal] | str:
    """The refused record's value names its source offset on partition 0 of ``req``."""
    if produced.value() == b"lost":
        return "its request cannot be found"
    offset = int(produced.value() or b"0")
    request = Message(topic="req", partition=0, offset=offset)
    return request, Refusal(("req", 0, offset), "publish", "result_refused", why, None)


def aborted(pipeline: str, *refused: bytes, error: KafkaError = REFUSED) -> Job:
    """A batch of ``pipeline`` whose records with these values the broker refused."""
    tracker = DeliveryTracker(pipeline, keep_refused=True)
    for value in refused:
        tracker.sent += 1
        tracker.on_delivery(error, Message(topic="res", partition=0, offset=-1, value=value))
    return Job(pipeline, [], tracker, {("req", 0): 10})


def tries(limit: int = 3) -> TransactionTries:
    return TransactionTries({"a": locate, "b": locate}, limit=limit)


def test_a_refusal_is_told_to_the_later_batches_of_its_pipeline_only() -> None:
    t = tries()
    before = t.refusals("a")
    t.failed([aborted("a", b"2")], "abortable")
    assert set(t.refusals("a")) == {("req", 0, 2)} and not t.refusals("b")
    assert not before, "a batch made before keeps what it was given"
    assert t.failures == 0, "learning a refusal is progress, not a failure"


def test_a_refused_record_also_fails_its_batch() -> None:
    tracker = aborted("a", b"2").tracker
    assert tracker.errors and not tracker.done


def test_a_commit_past_a_refusal_drops_it_and_forgetting_a_partition_drops_its_own() -> None:
    t = tries()
    t.failed([aborted("a", b"2", b"7")], "abortable")
    t.committed({("req", 0): 5})
    assert set(t.refusals("a")) == {("req", 0, 7)}
    t.forget([("req", 0)])
    assert not t.refusals("a")


def test_failures_that_teach_nothing_stop_at_the_limit_and_a_commit_resets_them() -> None:
    t = tries(limit=3)
    t.failed([aborted("a")], "abortable")
    t.failed([aborted("a", b"lost")], "abortable")  # refused, but its request is unknown
    t.committed({})
    t.failed([aborted("a")], "abortable")
    t.failed([aborted("a", b"2")], "abortable")  # taught a refusal: not counted
    t.failed([aborted("a", b"2")], "abortable")  # the same again: nothing new
    with pytest.raises(SinkError, match=r"3 transactions in a row failed.*unknown topic"):
        t.failed([aborted("a")], "unknown topic")
