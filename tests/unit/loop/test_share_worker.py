"""The share-group loop (``worker.loop.share_group``) against a fake share consumer: a
record is accepted only once its result or dead letter is delivered, released when it is
not (a failed delivery, a stop, the lock budget), a record on its last delivery becomes
a ``redelivered`` dead letter unprocessed, and a poll is all the worker holds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson
import pytest
from confluent_kafka import AcknowledgeType, KafkaError, Message

from streamfer_dev.modelgen import DemoModel
from tests.fakes.clock import FakeClock
from tests.fakes.share import FakeShareConsumer, request, share_worker
from tests.fakes.sink import FakeSink
from tests.fakes.waits import wait_for
from worker.core import DeliveryTracker, Job
from worker.errors import SinkError
from worker.loop.share_poll import (
    LockBudget,
    PollInFlight,
    isolated_from,
    keep_within,
    serving_order,
    split,
)


def in_thread(target: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


@dataclass
class HeldSink(FakeSink):
    """Delivers nothing until ``deliver`` is set; ``failing`` offsets are then refused
    with a broker error that is no fault of the record (the batch fails)."""

    deliver: threading.Event = field(default_factory=threading.Event)
    failing: set[str] = field(default_factory=set)

    def poll(self, timeout: float = 0.0) -> int:
        if not self.deliver.is_set():
            time.sleep(min(timeout, 0.001))
            return 0
        acked, self.unacked = self.unacked, []
        for tracker, msg in acked:
            rid = orjson.loads(msg.value() or b"{}").get("id")
            if rid in self.failing:
                tracker.on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT, "timed out"), msg)
            else:
                self.delivered.append(msg)
                tracker.on_delivery(None, msg)
        return len(acked)


# --- acknowledgement rules ------------------------------------------------------------


def test_records_are_accepted_only_after_their_results_are_delivered(
    classifier: DemoModel,
) -> None:
    sink = HeldSink()
    rig = share_worker(classifier, sink=sink)
    rig.consumer.produce(8)
    thread, errors = in_thread(rig.worker.run_once)
    wait_for(lambda: len(sink.sent) == 8)
    time.sleep(0.05)
    assert rig.consumer.acks == []  # produced, not delivered: nothing acknowledged
    sink.deliver.set()
    thread.join(10)
    assert not errors and not thread.is_alive()
    assert rig.consumer.accepted() == list(range(8))
    assert rig.consumer.released() == []
    assert rig.consumer.sent, "the acknowledgements went to the broker at once"
    results = sink.delivered_to("res")
    assert sorted(r["id"] for r in results) == [f"r{i}" for i in range(8)]


def test_a_poll_is_split_into_batches_that_overlap_in_the_stages(
    classifier: DemoModel,
) -> None:
    rig = share_worker(classifier, batch=4, in_flight=3)
    rig.consumer.produce(10)
    rig.worker.run_once()
    assert rig.consumer.polls == [10]
    assert rig.metrics.registry.get_sample_value("streamfer_batches_total", {"pipeline": "p"}) == 3
    assert rig.consumer.accepted() == list(range(10))


def test_a_failed_delivery_stops_the_worker_releasing_what_was_not_delivered(
    classifier: DemoModel,
) -> None:
    sink = HeldSink(failing={"r5"})
    sink.deliver.set()
    rig = share_worker(classifier, sink=sink, batch=4)
    rig.consumer.produce(8)
    with pytest.raises(SinkError, match="not acknowledging"):
        rig.worker.run(burst_idle_s=5)
    assert rig.consumer.accepted() == [0, 1, 2, 3]
    assert rig.consumer.released() == [4, 5, 6, 7]
    assert rig.consumer.closed and rig.consumer.sent
    released = rig.metrics.registry.get_sample_value(
        "streamfer_share_acknowledged_records_total", {"pipeline": "p", "type": "release"}
    )
    assert released == 4


def test_a_stop_drains_the_poll_in_flight(classifier: DemoModel) -> None:
    rig = share_worker(classifier, batch=4)
    rig.store.gate.clear()  # the first batch waits in its first stage
    rig.consumer.produce(8)
    thread, errors = in_thread(lambda: rig.worker.run())
    wait_for(lambda: rig.consumer.polls == [8])
    rig.worker.stop()
    time.sleep(0.05)
    rig.store.gate.set()
    thread.join(10)
    assert not errors and not thread.is_alive()
    assert rig.consumer.accepted() == list(range(8)) and rig.consumer.released() == []
    assert rig.consumer.closed


def test_a_stop_past_the_shutdown_timeout_releases_what_no_stage_started(
    classifier: DemoModel,
) -> None:
    """The batch running in a stage may still finish (and is then accepted); the one
    queued behind it is released, nothing of it produced."""
    rig = share_worker(classifier, batch=4, shutdown_timeout_s=0.2)
    rig.store.gate.clear()
    rig.consumer.produce(8)
    thread, errors = in_thread(lambda: rig.worker.run())
    wait_for(lambda: rig.consumer.polls == [8])
    rig.worker.stop()
    wait_for(lambda: rig.consumer.released() == [4, 5, 6, 7])
    rig.store.gate.set()
    thread.join(10)
    assert not errors and rig.consumer.closed
    assert rig.consumer.accepted() == [0, 1, 2, 3]
    assert sorted(r["id"] for r in rig.sink.delivered_to("res")) == ["r0", "r1", "r2", "r3"]


# --- deliveries ----------------------------------------------------------------------


def test_a_record_on_its_last_delivery_becomes_a_redelivered_dead_letter(
    classifier: DemoModel,
) -> None:
    rig = share_worker(classifier, limit=5)
    rig.consumer.waiting += [request(0), request(1, count=5, rid="poison"), request(2, count=3)]
    rig.worker.run_once()
    (letter,) = rig.sink.delivered_to("dlq")
    assert letter["code"] == "redelivered" and letter["stage"] == "consume"
    assert letter["delivery_count"] == 5 and letter["request_id"] == "poison"
    assert letter["source"]["offset"] == 1
    assert "share.delivery.count.limit = 5" in letter["reason"]
    assert sorted(r["id"] for r in rig.sink.delivered_to("res")) == ["r0", "r2"]
    assert rig.consumer.accepted() == [0, 1, 2]
    redelivered = rig.metrics.registry.get_sample_value(
        "streamfer_share_redeliveries_total", {"pipeline": "p"}
    )
    assert redelivered == 2
    dead = rig.metrics.registry.get_sample_value(
        "streamfer_dead_letters_total", {"pipeline": "p", "code": "redelivered"}
    )
    assert dead == 1


def test_records_near_their_last_delivery_are_served_alone_each_acknowledged_first(
    classifier: DemoModel,
) -> None:
    """Delivered 3 times of 5: one at a time, each acknowledgement at the broker before
    the next starts, descending on an odd count; the fresh records go first, batched."""
    rig = share_worker(classifier, limit=5, batch=4)
    rig.consumer.waiting += [request(i, count=3) for i in range(4)]
    rig.consumer.waiting += [request(4), request(5)]
    rig.worker.run_once()
    accepted = [at[2] for at, kind in rig.consumer.acks if kind == "ACCEPT"]
    assert accepted == [4, 5, 3, 2, 1, 0]
    sent = [[at[2] for at, _ in batch] for batch in rig.consumer.sent]
    assert sent == [[4, 5], [3], [2], [1], [0]]
    assert rig.metrics.registry.get_sample_value("streamfer_batches_total", {"pipeline": "p"}) == 5


def test_the_order_of_records_served_alone_turns_with_each_delivery() -> None:
    records = [request(i, count=c) for i, c in [(0, 4), (1, 3), (2, 4), (3, 1), (4, 3), (5, 5)]]
    batched, alone = serving_order(records, 5)
    assert [m.offset() for m in batched] == [3]  # the last delivery (5) is neither
    assert [(m.delivery_count(), m.offset()) for m in alone] == [(3, 4), (3, 1), (4, 0), (4, 2)]
    assert isolated_from(5) == 3 and isolated_from(3) == 2 and isolated_from(10) == 8


def test_a_released_record_comes_back_with_a_higher_delivery_count() -> None:
    """The fake's own rule, which the poison test in the integration suite relies on."""
    consumer = FakeShareConsumer(max_poll=2)
    consumer.produce(2)
    (first, _second) = consumer.poll(0)
    consumer.acknowledge(first, AcknowledgeType.RELEASE)
    consumer.acknowledge(_second)
    (again,) = consumer.poll(0)
    assert again.offset() == 0 and again.delivery_count() == 2


def test_a_refused_acknowledgement_is_counted(classifier: DemoModel) -> None:
    rig = share_worker(classifier)
    rig.consumer.refuse_acks = True
    rig.consumer.produce(3)
    rig.worker.run_once()
    refused = rig.metrics.registry.get_sample_value(
        "streamfer_share_acknowledgement_errors_total", {"pipeline": "p"}
    )
    assert refused == 3


# --- how much the worker holds --------------------------------------------------------


def test_the_worker_holds_one_poll_of_at_most_the_in_flight_bound(
    classifier: DemoModel,
) -> None:
    rig = share_worker(classifier, batch=4, in_flight=2)
    assert rig.consumer.max_poll == 8  # what wire_worker's config asks of librdkafka
    rig.store.gate.clear()
    rig.consumer.produce(20)
    thread, errors = in_thread(rig.worker.run_once)
    wait_for(lambda: rig.consumer.polls == [8])
    time.sleep(0.05)
    assert rig.worker.records_of("p") == 8
    held = rig.metrics.registry.get_sample_value("streamfer_in_flight_records", {"pipeline": "p"})
    assert held == 8
    rig.store.gate.set()
    thread.join(10)
    assert not errors
    assert rig.worker.records_of("p") == 0 and len(rig.consumer.waiting) == 12


def test_at_the_lock_budget_what_no_stage_started_is_released(classifier: DemoModel) -> None:
    """A poll outliving LOCK_SHARE of the record lock gives back the batches still
    queued; the running one goes on while its lock lasts."""
    clock = FakeClock(1000.0)
    rig = share_worker(classifier, batch=2, in_flight=4, lock_s=10.0, clock=clock)
    rig.store.gate.clear()
    rig.consumer.produce(8)
    thread, errors = in_thread(rig.worker.run_once)
    wait_for(lambda: rig.consumer.polls == [8])
    time.sleep(0.05)
    clock.now += 8.5  # past 80% of the lock: the queued batches go back
    wait_for(lambda: len(rig.consumer.released()) == 6)
    rig.store.gate.set()
    thread.join(10)
    assert not errors
    assert rig.consumer.accepted() == [0, 1] and rig.consumer.released() == [2, 3, 4, 5, 6, 7]
    assert [r["id"] for r in rig.sink.delivered_to("res")] == ["r0", "r1"]


def test_a_batch_still_running_when_its_lock_runs_out_is_not_produced(
    classifier: DemoModel,
) -> None:
    """The broker hands a record whose lock ran out to another member (on the group's
    last delivery, to be dead-lettered there): a result produced here too would give
    the request two outcomes. The batch is released and counted an overrun."""
    clock = FakeClock(1000.0)
    rig = share_worker(classifier, batch=2, in_flight=4, lock_s=10.0, clock=clock)
    rig.store.gate.clear()
    rig.consumer.produce(2, count=4)  # limit 5: the next delivery is the last
    thread, errors = in_thread(rig.worker.run_once)
    wait_for(lambda: rig.consumer.polls == [2])
    time.sleep(0.05)
    clock.now += 10.0  # past the lock, the batch still fetching its features
    rig.store.gate.set()
    thread.join(10)
    assert not errors
    assert rig.sink.delivered_to("res") == [] and rig.sink.delivered_to("dlq") == []
    assert rig.consumer.accepted() == [] and sorted(rig.consumer.released()) == [0, 1]
    overruns = rig.metrics.registry.get_sample_value(
        "streamfer_share_lock_overruns_total", {"pipeline": "p"}
    )
    assert overruns == 2


def test_a_poll_beyond_what_the_worker_finishes_in_time_is_partly_released_at_once(
    classifier: DemoModel,
) -> None:
    """The broker may hand out whole producer batches beyond max.poll.records: once the
    worker knows its rate, what it would not finish within the budget goes back."""
    clock = FakeClock(1000.0)
    consumer = FakeShareConsumer(whole=True)
    rig = share_worker(
        classifier, batch=4, in_flight=2, lock_s=10.0, clock=clock, consumer=consumer
    )
    budget = rig.worker.group._budget
    budget.observe(8, clock.now - 8.0)  # earlier: 8 records in 8 s, 1 record/s
    assert budget.room(4) == 8  # 80% of a 10 s lock
    consumer.produce(20)
    rig.worker.run_once()
    assert consumer.polls[0] == 20
    assert consumer.accepted() == list(range(8))
    assert consumer.released() == list(range(8, 20))


def test_records_of_several_pipelines_are_batched_apart(classifier: DemoModel) -> None:
    rig = share_worker(classifier, pipelines=("p", "q"))
    q = Message(
        topic="req-q",
        partition=0,
        offset=0,
        value=orjson.dumps({"id": "q0", "entity": "e1"}),
        delivery_count=1,
    )
    rig.consumer.waiting += [request(0), q, request(1)]
    rig.worker.run_once()
    assert sorted(r["id"] for r in rig.sink.delivered_to("res")) == ["r0", "r1"]
    assert [r["id"] for r in rig.sink.delivered_to("res-q")] == ["q0"]


# --- the plain parts ------------------------------------------------------------------


def test_split_cuts_each_pipelines_records_into_even_batches() -> None:
    records = [request(i) for i in range(10)]
    batches = list(split(records, {"req": "p"}, {"p": 4}))
    assert [len(b) for _, b in batches] == [4, 3, 3]
    assert [m.offset() for _, b in batches for m in b] == list(range(10))


def test_the_lock_budget_is_unknown_until_it_watched_long_enough() -> None:
    clock = FakeClock(1000.0)
    budget = LockBudget(30.0, clock)  # 24 s
    assert budget.room(4) is None
    budget.observe(10, clock.now - 0.5)  # 0.5 s watched of the 2.4 s it needs
    assert budget.room(4) is None
    budget.observe(1000, clock.now - 10.0)
    # (0.8 x 10 + 1000) records over (0.8 x 0.5 + 10) s: 96.9 records/s for 24 s
    assert budget.room(4) == 2326
    assert keep_within([request(i) for i in range(5)], 3)[1][0].offset() == 3
    assert keep_within([request(i) for i in range(5)], None)[1] == []


def test_the_lock_budget_outgrows_one_slow_poll() -> None:
    """A cold start or a Redis hiccup must not leave the budget stuck low: every later
    poll counts, however short."""
    clock = FakeClock(1000.0)
    budget = LockBudget(30.0, clock)  # 24 s
    budget.observe(8, clock.now - 3.0)  # 2.7 records/s
    assert budget.room(64) == 64
    for _ in range(50):  # then 64 records every 64 ms: 1,000 records/s
        budget.observe(64, clock.now - 0.064)
    assert budget.room(64) > 20_000


def test_the_lock_budget_counts_what_was_accepted_not_what_was_released(
    classifier: DemoModel,
) -> None:
    """2 of 8 records finished in 9 s (the other 6 went back at the budget): the next
    poll may hold what 2 records in 9 s says, not 8."""
    clock = FakeClock(1000.0)
    rig = share_worker(classifier, batch=2, in_flight=4, lock_s=10.0, clock=clock)
    rig.store.gate.clear()
    rig.consumer.produce(8)
    thread = threading.Thread(target=rig.worker.run_once, daemon=True)
    thread.start()
    wait_for(lambda: rig.consumer.polls == [8])
    time.sleep(0.05)
    clock.now += 8.5
    wait_for(lambda: len(rig.consumer.released()) == 6)
    clock.now += 0.5  # within the lock
    rig.store.gate.set()
    thread.join(10)
    assert rig.consumer.accepted() == [0, 1]
    assert rig.worker.group._budget.room(1) == 1  # 2 records / 9 s x 8 s = 1.8


def test_a_poll_in_flight_accepts_every_delivered_batch_and_names_the_failed_ones() -> None:
    def job(offset: int, errors: list[str]) -> Job:
        tracker = DeliveryTracker("p")
        tracker.errors += errors
        tracker.seal()
        return Job.close("p", [request(offset)], lambda _p, _ts: tracker)

    good, bad, later = job(0, []), job(1, ["boom"]), job(2, [])
    poll = PollInFlight([good, bad, later], 0.0, 30.0)
    settled = poll.settle()
    assert settled.accepted == [good, later] and settled.failed == [bad]
    assert poll.held() == [bad] and poll.open
    assert poll.release([bad]) == [bad] and not poll.open
