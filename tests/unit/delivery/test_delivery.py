"""At-least-once delivery: records the broker refuses for themselves are dead-lettered by
the loop thread, whichever thread their delivery report arrives on, and their batch is
then done (so its pipeline commits again); a keyless result for a compacted topic never
reaches the broker to take its batch-mates down with it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, Message

from streamfer_dev.modelgen import DemoModel
from tests.fakes.sink import FakeSink
from tests.fakes.worker import TOPIC, build_worker, turn_until
from worker.core.tracker import RESENDS_PER_RECORD, DeliveryTracker
from worker.delivery.mode import AtLeastOnce, Stages
from worker.kafka.limits import RecordLimits


class Refusal:
    """A broker's refusal of one record (``INVALID_RECORD``) that runs ``meanwhile`` while
    the tracker reads its text: the moment ``on_delivery`` has decided whether to queue
    the tracker and has not yet kept the record."""

    def __init__(self, meanwhile: Callable[[], None] = lambda: None) -> None:
        self._meanwhile = meanwhile

    def code(self) -> int:
        return KafkaError.INVALID_RECORD

    def str(self) -> str:
        self._meanwhile()
        return "Broker: Invalid record"


class DeadLettering:
    """The pipeline's part: each refused record becomes one dead letter, delivered."""

    def __init__(self) -> None:
        self.offsets: list[int] = []

    def dead_letter_undelivered(
        self, sink: Any, tracker: DeliveryTracker, produced: Message, why: str
    ) -> None:
        self.offsets.append(cast(int, produced.offset()))
        tracker.sent += 1
        tracker.acked += 1


def at_least_once(pipeline: DeadLettering) -> AtLeastOnce:
    stages = Stages(
        sink=cast(Any, FakeSink()),
        threads=cast(Any, None),
        committer=cast(Any, None),
        pipelines=cast(Any, {"p": pipeline}),
        metrics=cast(Any, SimpleNamespace()),
    )
    return AtLeastOnce(stages)


def refused(offset: int) -> Message:
    return Message(topic="res", partition=0, offset=offset)


def test_a_refusal_reported_while_the_loop_dead_letters_the_batch_is_dead_lettered_too() -> None:
    """The second refusal's report arrives on a processing thread (``acknowledge``'s poll)
    just as the loop thread dead-letters the first one. However the two interleave, both
    become dead letters and the batch is done; here the loop runs in the report's window
    between deciding whether to queue the batch and keeping the record."""
    pipeline = DeadLettering()
    delivery = at_least_once(pipeline)
    tracker = delivery.tracker("p", 0)
    tracker.sent = 2
    tracker.seal()
    tracker.on_delivery(cast(KafkaError, Refusal()), refused(1))

    loop = threading.Thread(target=delivery.serve, args=(0,))

    def loop_turn_meanwhile() -> None:
        loop.start()
        loop.join(0.2)  # done at once, unless the tracker makes it wait its turn

    tracker.on_delivery(cast(KafkaError, Refusal(loop_turn_meanwhile)), refused(2))
    loop.join(5)
    assert not loop.is_alive()
    for _ in range(3):  # the loop's later turns
        delivery.serve(0)
    assert sorted(pipeline.offsets) == [1, 2], "each refused record is dead-lettered once"
    assert tracker.done, "the batch is done, so its pipeline commits again"


def test_a_synchronous_commit_with_a_refused_partition_counts_as_a_commit_failure() -> None:
    """The revoke's commit raises nothing when the broker refuses only some partitions;
    the failure still shows in ``streamfer_commit_failures``."""
    from confluent_kafka import KafkaError
    from prometheus_client import CollectorRegistry, Counter, Gauge

    from tests.fakes.jobs import job, sent
    from tests.fakes.worker import FakeConsumer
    from worker.delivery.committer import Committer
    from worker.delivery.mode import commit_delivered

    consumer = FakeConsumer(rejects={("req", 3): KafkaError(KafkaError.ILLEGAL_GENERATION)})
    committer = Committer(consumer)
    committer.track(job(sent(0), {("req", 2): 429, ("req", 3): 453}))
    registry = CollectorRegistry()
    failures = Counter("failures", "", registry=registry)
    metrics = SimpleNamespace(
        commit_failures=failures, in_flight_batches=Gauge("b", "", registry=registry)
    )
    stages = Stages(
        sink=cast(Any, FakeSink()),
        threads=cast(Any, None),
        committer=committer,
        pipelines=cast(Any, {}),
        metrics=cast(Any, metrics),
    )
    commit_delivered(stages, asynchronous=False, count=False)
    assert registry.get_sample_value("failures_total") == 1
    consumer.rejects.clear()
    commit_delivered(stages, asynchronous=False, count=False)
    assert registry.get_sample_value("failures_total") == 1, "the retry went through"


@pytest.mark.parametrize("known", [True, False], ids=["policy-read", "policy-unknown"])
def test_a_keyless_result_for_a_compacted_topic_is_dead_lettered_alone(
    classifier: DemoModel, known: bool
) -> None:
    """The broker refuses a keyless record's whole produce batch on a compacted topic:
    INVALID_RECORD for it, librdkafka's ``_INVALID_DIFFERENT_RECORD`` for its batch-mates.
    A worker that knows the topic compacts dead-letters the keyless result before produce;
    one that cannot know (DescribeConfigs refused, or compacted after start-up) dead-letters
    it on the refusal and sends its batch-mates again. Either way each keyed result is
    delivered once and the worker goes on committing."""
    limits = RecordLimits(1_000_000, {}, compacted={"res"}) if known else None
    worker, consumer, sink, _ = build_worker(classifier, batch=8, limits=limits)
    sink.compacted = {"res"}
    consumer.assign((TOPIC, 0))
    consumer.produce(0, 7)
    consumer.drop_key(0, 3)
    turn_until(worker, lambda: any(o[0].offset == 7 for o in consumer.async_commits))
    results = sorted(doc["id"] for doc in sink.delivered_to("res"))
    assert results == [f"r0-{i}" for i in (0, 1, 2, 4, 5, 6)], "each keyed result once"
    (dead,) = sink.delivered_to("dlq")
    assert (dead["request_id"], dead["code"]) == ("r0-3", "result_refused")
    if known:
        assert "res cannot take the result: compacted topic needs a key" in dead["reason"]
    consumer.produce(0, 2)
    turn_until(worker, lambda: any(o[0].offset == 9 for o in consumer.async_commits))
    assert len(sink.delivered_to("res")) == 8, "the worker goes on"


def test_a_record_refused_with_its_batch_mates_again_and_again_fails_its_batch() -> None:
    """The re-send is bounded: a record failed for a batch-mate on every try fails its
    batch (a delivery failure, which stops the worker) instead of looping."""
    sink = FakeSink()
    tracker = DeliveryTracker("p")
    tracker.sent = 2
    record = Message(topic="res", partition=0, offset=1, value=b"v")
    for _ in range(RESENDS_PER_RECORD * 2):
        sink.resend(tracker, record)
    assert len(sink.sent) == RESENDS_PER_RECORD * 2 and not tracker.errors
    sink.resend(tracker, record)
    assert len(sink.sent) == RESENDS_PER_RECORD * 2
    assert tracker.errors == ["res: refused with its batch-mates again and again"]
