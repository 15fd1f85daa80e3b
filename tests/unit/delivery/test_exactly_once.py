"""Exactly-once delivery under rebalances and producer errors, against fake clients.

The fake transactional producer checks at every commit that the transaction holds the
offset of every record it answers, and only offsets of partitions the worker owns; each
test also checks that no request is answered twice in committed transactions. Every
sequence here was traced by a review of the transactional strategy.
"""

from __future__ import annotations

import threading
import time
from functools import partial
from types import SimpleNamespace
from typing import Any, cast

import orjson
import pytest
from confluent_kafka import KafkaError, KafkaException, Message

from streamfer_dev.modelgen import DemoModel
from tests.fakes import worker as fakes
from tests.fakes.worker import TOPIC, FakeConsumer, build_worker, turn_until
from worker.config import BatchPolicy, PipelineConfig
from worker.delivery.transaction_tries import FAILURES_IN_A_ROW
from worker.errors import ProducerUnusable, SinkError, SourceError
from worker.kafka.limits import RecordLimits
from worker.loop.worker import Worker

P0, P1 = (TOPIC, 0), (TOPIC, 1)


def eos(classifier: DemoModel, **kw: Any) -> tuple[Worker, FakeConsumer, Any, Any]:
    worker, consumer, sink, store = build_worker(
        classifier, exactly_once=True, shutdown_timeout_s=5, **kw
    )
    return worker, consumer, sink.producer, store


def answered_once(producer: Any) -> bool:
    sources = producer.sources()
    return len(sources) == len(set(sources))


def test_batches_commit_in_transactions_with_their_offsets(classifier: DemoModel) -> None:
    worker, consumer, producer, _ = eos(classifier)
    consumer.assign(P0, P1)
    consumer.produce(0, 6)
    consumer.produce(1, 3)
    turn_until(worker, lambda: len(producer.sources()) == 9)
    assert consumer.group_offsets == {P0: 6, P1: 3}
    assert answered_once(producer) and producer.aborted == []


def test_partitions_lost_while_a_transaction_is_open_abort_it(classifier: DemoModel) -> None:
    worker, consumer, producer, store = eos(classifier)
    consumer.assign(P0, P1)
    store.gate.clear()  # the next batch stays in its stage
    consumer.produce(0, 4)
    turn_until(worker, lambda: producer.open is not None)
    consumer.events.append(lambda c: c.lose(P0))
    threading.Timer(0.3, store.gate.set).start()
    worker.run_once()  # the loss comes inside consume
    assert len(producer.aborted) == 1, "the open transaction holds results of a lost partition"
    consumer.produce(1, 4)
    turn_until(worker, lambda: len(producer.sources()) == 4)
    assert producer.sources() == [(1, i) for i in range(4)]
    assert all(P0 not in txn.offsets for txn in producer.committed)


def test_batches_held_while_a_transaction_closes_commit_their_offsets_on_revoke(
    classifier: DemoModel,
) -> None:
    worker, consumer, producer, store = eos(classifier, transaction_interval_ms=0)
    consumer.assign(P0)
    store.gate.clear()
    consumer.produce(0, 4)
    turn_until(worker, lambda: producer.open is not None)
    consumer.produce(0, 4)  # closes while the first waits: held for the next transaction
    turn_until(worker, lambda: worker.group._delivery.records_in_flight() == 8)
    consumer.events.append(lambda c: c.revoke(P0))
    threading.Timer(0.3, store.gate.set).start()
    worker.run_once()
    # the fake producer refuses any commit of results without their offsets
    assert producer.sources() == [(0, i) for i in range(8)]
    assert consumer.group_offsets == {P0: 8}


def test_a_rewind_without_committed_offsets_never_skips_what_was_consumed(
    classifier: DemoModel,
) -> None:
    worker, consumer, producer, _ = eos(classifier, kafka={"auto_offset_reset": "latest"})
    consumer.assign(P0)  # nothing committed: its start is pinned at the log end, 0
    consumer.produce(0, 4)
    producer.fail_commit.append(KafkaError(KafkaError._STATE, "abort", txn_requires_abort=True))
    turn_until(worker, lambda: len(producer.aborted) == 1)
    assert consumer.seeks == [(P0, 0)], "rewound to where it began, not to the log end"
    turn_until(worker, lambda: len(producer.sources()) == 4)
    assert producer.sources() == [(0, i) for i in range(4)]


def test_held_batches_count_toward_the_bound(classifier: DemoModel) -> None:
    worker, consumer, producer, store = eos(
        classifier, batch=4, in_flight=2, transaction_interval_ms=0
    )
    consumer.assign(P0)
    store.gate.clear()
    consumer.produce(0, 40)
    turn_until(worker, lambda: consumer.paused == {P0})
    assert worker.group._delivery.records_in_flight() >= 8
    assert consumer.positions[P0] < 40, "the partition paused before fetching it all"
    store.gate.set()
    turn_until(worker, lambda: len(producer.sources()) == 40)
    assert answered_once(producer)


def test_an_abortable_error_aborts_rewinds_and_answers_each_request_once(
    classifier: DemoModel,
) -> None:
    worker, consumer, producer, _ = eos(classifier)
    consumer.assign(P0)
    consumer.produce(0, 8)
    producer.fail_commit.append(
        KafkaError(KafkaError.INVALID_PRODUCER_EPOCH, "retry", txn_requires_abort=True)
    )
    turn_until(worker, lambda: len(producer.sources()) == 8)
    assert len(producer.aborted) == 1
    assert answered_once(producer)
    assert producer.init_calls == 0


def test_a_retriable_commit_error_is_retried(classifier: DemoModel) -> None:
    worker, consumer, producer, _ = eos(classifier)
    consumer.assign(P0)
    consumer.produce(0, 4)
    producer.fail_commit.append(KafkaError(KafkaError._TIMED_OUT, "again", retriable=True))
    turn_until(worker, lambda: len(producer.sources()) == 4)
    assert producer.aborted == []


@pytest.mark.parametrize(
    "error",
    [
        KafkaError(KafkaError._FENCED, "fenced", fatal=True),
        KafkaError(KafkaError.PRODUCER_FENCED, "fenced by a newer producer", fatal=True),
        KafkaError(KafkaError._FATAL, "idempotence broken", fatal=True),
    ],
)
def test_a_fenced_or_fatal_producer_stops_the_worker_and_is_never_reinitialised(
    classifier: DemoModel, error: KafkaError
) -> None:
    worker, consumer, producer, _ = eos(classifier)
    consumer.assign(P0)
    consumer.produce(0, 4)
    producer.fail_commit.append(error)
    with pytest.raises(ProducerUnusable, match="cannot go on"):
        turn_until(worker, lambda: False)
    assert producer.init_calls == 0
    assert producer.committed == []


def test_a_transactional_call_stuck_past_its_timeout_stops_the_worker(
    classifier: DemoModel,
) -> None:
    """librdkafka's send_offsets_to_transaction can ignore its timeout when the group
    coordinator goes away: the worker must see it, turn unhealthy and stop (its clients
    left unclosed), instead of holding every partition for good."""
    from worker.errors import CallStalled
    from worker.kafka.call_watch import CallWatch
    from worker.ops.health import HealthState

    health = HealthState()
    calls = CallWatch(
        timeout_s=5, coordinator_timeout_s=0.1, margin_s=0.2, on_stall=health.call_stalled
    )
    worker, consumer, producer, _ = eos(classifier, transaction_calls=calls)
    worker.health = health
    release = threading.Event()
    stuck: list[float] = []

    def send_offsets(offsets: Any, metadata: object, timeout: float) -> None:
        stuck.append(timeout)
        release.wait(30)  # the coordinator went away; librdkafka never answers

    producer.send_offsets_to_transaction = send_offsets
    closed: list[bool] = []
    consumer.close = lambda: closed.append(True)  # type: ignore[attr-defined]
    consumer.assign(P0)
    consumer.produce(0, 4)
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    release.set()
    assert not thread.is_alive(), "the loop stayed inside the stuck call"
    assert stuck == [0.1]
    assert outcome and isinstance(outcome[0], CallStalled)
    assert "send_offsets_to_transaction stalled" in str(outcome[0])
    assert not health.live() and "stalled" in health.liveness_problem()
    assert not closed, "closing the consumer would wait on the same dead coordinator"
    assert producer.committed == []


def test_a_record_fetched_before_a_rewind_of_its_partition_is_never_batched(
    classifier: DemoModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adaptive batching fetches in two calls (``consume_first``): a loss served inside
    the second rewinds the partitions still owned, so the record the first call returned
    for one of them is fetched again after the seek and must not be batched as well."""
    monkeypatch.setattr(fakes, "BatchPolicy", partial(BatchPolicy, mode="adaptive"))
    worker, consumer, producer, store = eos(classifier)
    consumer.assign(P0, P1)
    store.gate.clear()  # P0's batch stays in its stage: its transaction stays open
    consumer.produce(0, 4)
    turn_until(worker, lambda: producer.open is not None)
    consumer.produce(1, 4)
    first: list[int] = []

    def polled(msg: Message | None) -> None:
        if msg is not None and msg.partition() == 1 and not first:
            first.append(msg.offset())
            consumer.events.append(lambda c: c.lose(P0))  # served by the next call
            threading.Timer(0.3, store.gate.set).start()

    consumer.on_poll = polled
    turn_until(worker, lambda: len(producer.aborted) == 1)
    assert first == [0] and consumer.seeks == [(P1, 0)]
    turn_until(worker, lambda: {o for p, o in producer.sources() if p == 1} >= {0, 1, 2, 3})
    for _ in range(20):
        worker.run_once()
    assert producer.sources() == [(1, i) for i in range(4)]


def abandon_mid_publish(classifier: DemoModel, shutdown_timeout_s: float) -> tuple[Worker, Any]:
    """A worker whose batch of partition 1 publishes slowly (a full local queue, 0.25 s a
    record), losing partition 0 at its first record: its transaction is abandoned and P1
    rewound while the batch is still producing."""
    worker, consumer, sink, _ = build_worker(
        classifier,
        exactly_once=True,
        in_flight=8,
        shutdown_timeout_s=shutdown_timeout_s,
        transaction_interval_ms=2000,
    )
    consumer.assign(P0, P1)
    send, calls = sink.send, []

    def slow_send(tracker: Any, topic: str, value: bytes, key: Any, headers: Any) -> bool:
        if len(calls) < 4 and dict(headers or [])["streamfer.source_partition"] in (b"1", "1"):
            calls.append(topic)
            if len(calls) == 1:
                consumer.events.append(lambda c: c.lose(P0))  # the next consume abandons
            time.sleep(0.25)
        return bool(send(tracker, topic, value, key, headers))

    sink.send = slow_send
    consumer.produce(0, 4)
    consumer.produce(1, 4)
    turn_until(worker, lambda: len(sink.producer.aborted) == 1)
    return worker, sink.producer


def test_a_batch_abandoned_mid_publish_never_reaches_a_later_transaction(
    classifier: DemoModel,
) -> None:
    """The abandoned batch goes on producing, for longer than ``shutdown_timeout_s``; no
    transaction begins before it is out of the stages, so none of its records commits
    beside its re-consumed copies, and the loop keeps polling meanwhile."""
    worker, producer = abandon_mid_publish(classifier, shutdown_timeout_s=0.3)
    consumer = cast(FakeConsumer, worker.group._source.consumer)
    polled: list[object] = []
    consumer.events.append(lambda c: polled.append(producer.open))
    worker.run_once()
    assert polled == [None], "polling on, with no transaction open behind the batch"
    turn_until(worker, lambda: {o for p, o in producer.sources() if p == 1} >= {0, 1, 2, 3})
    for _ in range(50):
        worker.run_once()
    assert producer.sources() == [(1, i) for i in range(4)]


def test_a_clean_stop_waits_for_an_abandoned_batch_then_commits_what_it_held(
    classifier: DemoModel,
) -> None:
    worker, producer = abandon_mid_publish(classifier, shutdown_timeout_s=5)
    worker.stop()
    worker.run()  # drains: the held batches begin once the abandoned one is done
    assert producer.sources() == [(1, i) for i in range(4)]
    assert cast(FakeConsumer, worker.group._source.consumer).group_offsets[P1] == 4


def test_held_batches_count_toward_a_pipelines_share(
    classifier: DemoModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches held for the next transaction are consumed and uncommitted like those in
    the open one: a pipeline with a share of the bound pauses at its share with them."""
    monkeypatch.setattr(fakes, "PipelineConfig", partial(PipelineConfig, max_in_flight_share=0.5))
    worker, consumer, producer, store = eos(
        classifier, batch=4, in_flight=4, transaction_interval_ms=0
    )
    consumer.assign(P0)
    store.gate.clear()  # the first batch holds its transaction open; the rest are held
    consumer.produce(0, 40)
    turn_until(worker, lambda: consumer.paused == {P0})
    assert worker.group._delivery.records_in_flight() == 8, "the share: half of 4 batches of 4"
    store.gate.set()
    turn_until(worker, lambda: len(producer.sources()) == 40)
    assert answered_once(producer)


def test_a_refused_begin_transaction_stops_the_worker_naming_the_call(
    classifier: DemoModel,
) -> None:
    worker, consumer, producer, _ = eos(classifier)
    consumer.assign(P0)
    consumer.produce(0, 4)

    def begin() -> None:
        raise KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))

    producer.begin_transaction = begin
    with pytest.raises(ProducerUnusable, match="begin_transaction"):
        turn_until(worker, lambda: False)
    with pytest.raises(ProducerUnusable, match="begin_transaction"):
        worker.group._delivery.commit()  # again, in case a revoke (which logs, goes on) caught it


BROKER_DOWN = KafkaError(KafkaError._TRANSPORT, "broker down")


def _raise(*_args: Any, **_kw: Any) -> Any:
    raise KafkaException(BROKER_DOWN)


def _unreadable(partitions: list[Any], timeout: float) -> list[Any]:
    return [
        SimpleNamespace(topic=t.topic, partition=t.partition, offset=-1001, error=BROKER_DOWN)
        for t in partitions
    ]


@pytest.mark.parametrize(
    ("call", "fake", "named"),
    [
        ("committed", _raise, r"committed\(\) failed"),
        ("committed", _unreadable, r"committed\(\) of req\[0\] failed"),
        ("seek", _raise, r"seek of req\[0\] failed"),
    ],
    ids=["committed-raises", "committed-unreadable", "seek-raises"],
)
def test_a_rewind_that_cannot_read_or_seek_the_committed_offsets_stops_the_worker(
    classifier: DemoModel, call: str, fake: Any, named: str
) -> None:
    """Stopping is safe (nothing commits; the next owner starts from the committed
    offsets); an unreadable offset is not taken for none, which would seek to the reset."""
    worker, consumer, producer, _ = eos(classifier)
    consumer.assign(P0)
    consumer.produce(0, 4)
    producer.fail_commit.append(KafkaError(KafkaError._STATE, "abort", txn_requires_abort=True))
    setattr(consumer, call, fake)
    with pytest.raises(SourceError, match=named):
        turn_until(worker, lambda: False)
    assert producer.committed == [] and consumer.seeks == []


# -- records the broker refuses, and failures that persist -------------------------------


def served_with_a_keyless_request(
    classifier: DemoModel, refuse: Any, n: int, keyless: int
) -> tuple[Worker, FakeConsumer, Any]:
    """``n`` requests on partition 0, the one at offset ``keyless`` without a key (so its
    result has none), served by a producer that refuses what ``refuse`` says, until the
    group's offset is past them all."""
    worker, consumer, producer, _ = eos(classifier)
    producer.refuse = refuse
    consumer.assign(P0)
    consumer.produce(0, n)
    log = consumer.logs[P0]
    log[keyless] = Message(
        topic=TOPIC, partition=0, offset=keyless, value=log[keyless].value(), timestamp=(1, 1)
    )
    turn_until(worker, lambda: consumer.group_offsets.get(P0) == n, timeout=5)
    return worker, consumer, producer


def compacted(topic: str, value: bytes, key: bytes | None, headers: Any) -> KafkaError | None:
    """The result topic is compacted (the worker could not read so): the broker refuses a
    result without a key."""
    if topic == "res" and key is None:
        return KafkaError(KafkaError.INVALID_RECORD, "compacted topic needs a key")
    return None


def committed(producer: Any, topic: str) -> list[dict[str, bytes]]:
    """The headers of every record of ``topic`` in a committed transaction."""
    return [
        dict(headers)
        for txn in producer.committed
        for t, _value, headers, _cb in txn.records
        if t == topic
    ]


def results_beside_a_refused(producer: Any, keyless: int) -> list[int]:
    """The source offsets of the committed results, once it is checked that the only
    committed dead letter is the ``result_refused`` of the request at ``keyless`` and
    that every request was answered once."""
    (dead,) = committed(producer, "dlq")
    assert (dead["streamfer.source_offset"], dead["streamfer.error_code"]) == (
        str(keyless).encode(),
        b"result_refused",
    )
    assert b"compacted topic needs a key" in dead["streamfer.error_reason"]
    assert answered_once(producer)
    return sorted(int(h["streamfer.source_offset"]) for h in committed(producer, "res"))


def test_a_record_the_broker_refuses_becomes_its_dead_letter_inside_the_transaction(
    classifier: DemoModel,
) -> None:
    """As at-least-once does: the keyless result on a compacted topic becomes a
    ``result_refused`` dead letter; the transaction aborts once, not on every try."""
    worker, consumer, producer = served_with_a_keyless_request(classifier, compacted, 8, 2)
    assert len(producer.aborted) == 1, "the refusal is learned from the first abort"
    assert results_beside_a_refused(producer, 2) == [0, 1, 3, 4, 5, 6, 7]
    consumer.produce(0, 4)  # later requests are answered as usual
    turn_until(worker, lambda: consumer.group_offsets.get(P0) == 12, timeout=5)
    assert len(producer.aborted) == 1


def test_a_keyless_result_for_a_compacted_topic_is_dead_lettered_without_an_abort(
    classifier: DemoModel,
) -> None:
    """The broker refuses a keyless record's whole batch on a compacted topic: every
    result of the transaction with it. A worker that knows the topic compacts sends that
    request's dead letter instead, inside the transaction, which commits the first time."""
    known = RecordLimits(1_000_000, {}, compacted={"res"})
    worker, consumer, producer, _ = eos(classifier, batch=8, limits=known)
    producer.compacted = {"res"}
    consumer.assign(P0)
    consumer.produce(0, 7)
    consumer.drop_key(0, 3)
    turn_until(worker, lambda: consumer.group_offsets.get(P0) == 7, timeout=5)
    assert producer.aborted == []
    assert results_beside_a_refused(producer, 3) == [0, 1, 2, 4, 5, 6]


def test_a_refused_dead_letter_is_sent_again_without_the_original_record(
    classifier: DemoModel,
) -> None:
    """The dead letter in place of a refused result is refused too: the next try sends
    it bare, as at-least-once does, and the transaction commits."""

    def refuse(topic: str, value: bytes, key: bytes | None, headers: Any) -> KafkaError | None:
        if topic == "dlq" and orjson.loads(value)["value_b64"] is not None:
            return KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large for dlq")
        return compacted(topic, value, key, headers)

    _, _, producer = served_with_a_keyless_request(classifier, refuse, 4, 1)
    assert len(producer.aborted) == 2
    ((_topic, value, headers, _cb),) = [
        r for t in producer.committed for r in t.records if r[0] == "dlq"
    ]
    doc = orjson.loads(value)
    assert (doc["code"], doc["key_b64"], doc["value_b64"]) == ("result_refused", None, None)
    assert dict(headers)["streamfer.source_offset"] == b"1"
    assert answered_once(producer)


@pytest.mark.parametrize(
    "error",
    [
        KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, "unknown topic"),
        KafkaError(KafkaError._MSG_TIMED_OUT, "message timed out"),
    ],
)
def test_a_persistent_delivery_failure_stops_the_worker_instead_of_looping(
    classifier: DemoModel, error: KafkaError
) -> None:
    worker, consumer, producer, _ = eos(classifier)
    producer.refuse = lambda topic, *_: error if topic == "res" else None
    consumer.assign(P0)
    consumer.produce(0, 8)
    with pytest.raises(SinkError, match=f"{FAILURES_IN_A_ROW} transactions in a row failed"):
        turn_until(worker, lambda: False, timeout=5)
    assert len(producer.aborted) == FAILURES_IN_A_ROW
    assert producer.committed == [] and P0 not in consumer.group_offsets


def test_only_failures_in_a_row_stop_the_worker(classifier: DemoModel) -> None:
    """A commit in between starts the count again: aborts now and then (as the fault
    harness injects) never stop a worker that makes progress."""
    worker, consumer, producer, _ = eos(classifier)
    consumer.assign(P0)
    abortable = KafkaError(KafkaError._STATE, "abort", txn_requires_abort=True)
    for n in (4, 8):
        consumer.produce(0, 4)
        producer.fail_commit.extend([abortable] * (FAILURES_IN_A_ROW - 1))
        turn_until(worker, lambda n=n: consumer.group_offsets.get(P0) == n, timeout=5)
    assert len(producer.aborted) == 2 * (FAILURES_IN_A_ROW - 1)
    assert producer.sources() == [(0, i) for i in range(8)]
