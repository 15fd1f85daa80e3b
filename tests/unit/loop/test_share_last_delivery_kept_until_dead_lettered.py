"""A record on its share group's last delivery ends as a dead letter, never archived
unseen: the broker archives it whatever the worker does with it now (a release, its lock
running out, its member leaving), so while its dead letter cannot be delivered for a
reason not about the record (the topic not authorised, a delivery timeout) the worker
keeps it and sends the dead letter again, as in an outage."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from confluent_kafka import KafkaError

from streamfer_dev.modelgen import DemoModel
from tests.fakes.clock import FakeClock
from tests.fakes.share import FakeShareConsumer, request, share_worker
from tests.fakes.sink import FakeSink

LIMIT = 5
LOCK_S = 1000.0


@dataclass
class DlqDownSink(FakeSink):
    """Results are delivered; the dead-letter topic refuses the first ``failures``
    dead letters (not a record error: the batch fails), calling ``on_failure``; the
    clock moves 0.25 s with each poll of the producer that serves a report, and with
    every poll once ``results`` results were delivered: before that, the loop's idle
    polls do not move it, so however slowly the stage threads run here, the batched
    records are never given up on for the time the loop spun meanwhile."""

    clock: FakeClock = field(default_factory=lambda: FakeClock(1000.0))
    failures: int = 1_000_000
    on_failure: Callable[[], None] = lambda: None
    results: int = 2

    def poll(self, timeout: float = 0.0) -> int:
        acked, self.unacked = self.unacked, []
        if acked or len(self.delivered_to("res")) >= self.results:
            self.clock.now += 0.25
        for tracker, msg in acked:
            if msg.topic() == "dlq" and self.failures > 0:
                self.failures -= 1
                self.on_failure()
                err = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "not authorised")
                tracker.on_delivery(err, msg)
            else:
                self.delivered.append(msg)
                tracker.on_delivery(None, msg)
        return len(acked)


def test_a_failed_last_delivery_dead_letter_is_sent_again_until_delivered(
    classifier: DemoModel,
) -> None:
    clock = FakeClock(1000.0)
    consumer = FakeShareConsumer(max_poll=8, archive_at=LIMIT)
    sink = DlqDownSink(clock=clock, failures=4)
    rig = share_worker(
        classifier, limit=LIMIT, lock_s=LOCK_S, consumer=consumer, sink=sink, clock=clock
    )
    consumer.waiting += [request(0), request(1, count=LIMIT, rid="last"), request(2)]
    rig.worker.run_once()
    (letter,) = sink.delivered_to("dlq")
    assert letter["request_id"] == "last" and letter["code"] == "redelivered"
    assert sorted(r["id"] for r in sink.delivered_to("res")) == ["r0", "r2"]
    assert consumer.accepted() == [0, 1, 2]
    assert consumer.released() == [] and consumer.archived == []
    assert sink.failures == 0  # sent five times


def test_a_stop_while_the_dead_letter_fails_names_the_record_the_broker_archives(
    classifier: DemoModel, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker stops (the shutdown timeout passes) with the dead-letter topic still
    refusing: the record is not released (the broker archives it all the same when the
    member leaves), and the log names it."""
    clock = FakeClock(1000.0)
    consumer = FakeShareConsumer(max_poll=8, archive_at=LIMIT)
    sink = DlqDownSink(clock=clock)
    rig = share_worker(
        classifier, limit=LIMIT, lock_s=LOCK_S, consumer=consumer, sink=sink, clock=clock
    )
    sink.on_failure = rig.worker.stop
    consumer.waiting += [request(0), request(1, count=LIMIT, rid="last"), request(2)]
    rig.worker.run()
    assert sorted(r["id"] for r in sink.delivered_to("res")) == ["r0", "r2"]
    assert consumer.accepted() == [0, 2] and consumer.released() == []
    assert consumer.closed
    assert "req[0]@1 (delivery 5, the share group's last)" in caplog.text
