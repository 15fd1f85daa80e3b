"""The worker's loop, turn by turn, against fake Kafka clients (``tests/fakes/worker.py``):
batches publish and commit, and the bound of records in flight always releases, whatever
order commit answers and rebalances come in."""

from __future__ import annotations

import time

import orjson
import pytest
from confluent_kafka import KafkaError

from streamfer_dev.modelgen import DemoModel
from tests.fakes.worker import TOPIC, build_worker, turn_until
from worker.delivery.committer import STALLED_COMMIT_S
from worker.errors import CommitError, SourceError

ILLEGAL_GENERATION = KafkaError(KafkaError.ILLEGAL_GENERATION)


def test_a_batch_is_published_then_committed(classifier: DemoModel) -> None:
    worker, consumer, sink, _ = build_worker(classifier)
    consumer.assign((TOPIC, 0))
    consumer.produce(0, 10)
    turn_until(worker, lambda: len(sink.sent) == 10)
    turn_until(worker, lambda: any(o[0].offset == 10 for o in consumer.async_commits))
    assert [orjson.loads(v)["id"] for _, v in sink.sent] == [f"r0-{i}" for i in range(10)]
    consumer.answer(None)
    assert worker.group._delivery.records_in_flight() == 0


def test_a_new_partition_without_a_committed_offset_is_pinned_before_it_is_fetched(
    classifier: DemoModel,
) -> None:
    worker, consumer, sink, _ = build_worker(classifier, kafka={"auto_offset_reset": "latest"})
    consumer.produce(0, 3)  # before the assignment: 'latest' starts after them
    consumer.group_offsets[(TOPIC, 1)] = 0  # committed before: left alone
    consumer.assign((TOPIC, 0), (TOPIC, 1))
    assert consumer.sync_commits == [[(TOPIC, 0, 3)]]
    consumer.produce(0, 2)
    turn_until(worker, lambda: len(sink.sent) == 2)
    assert [orjson.loads(v)["id"] for _, v in sink.sent] == ["r0-3", "r0-4"]


def test_the_kept_partition_resumes_when_a_revoke_commits_its_rejected_offsets(
    classifier: DemoModel,
) -> None:
    """The post-kill stall: while the group rebalances, commits go unanswered and the
    worker pauses at its bound; then, inside one consume, they are all rejected and the
    revoke of another partition commits synchronously, the kept partition's retry
    included. That answer must release the kept partition's records."""
    worker, consumer, sink, _ = build_worker(classifier, batch=4, in_flight=2)  # bound 8
    p2, p3 = (TOPIC, 2), (TOPIC, 3)
    consumer.assign(p2, p3)
    consumer.produce(2, 4)
    consumer.produce(3, 8)
    turn_until(worker, lambda: len(sink.sent) == 12)
    turn_until(worker, lambda: not len(worker.group._committer))
    time.sleep(STALLED_COMMIT_S)  # unanswered that long, the commits count again
    turn_until(worker, lambda: consumer.paused == {p2, p3})
    consumer.produce(3, 4)  # more work waits on the kept partition
    consumer.events += [
        lambda c: c.answer(ILLEGAL_GENERATION),
        lambda c: c.revoke(p2),
    ]
    worker.run_once()
    assert consumer.sync_commits[-1] == [(TOPIC, 2, 4), (TOPIC, 3, 8)]
    assert worker.group._delivery.records_in_flight() == 0
    turn_until(worker, lambda: p3 not in consumer.paused)
    turn_until(worker, lambda: len(sink.sent) == 16)


def test_a_partition_paused_revoked_and_assigned_again_is_fetched(classifier: DemoModel) -> None:
    worker, consumer, sink, _ = build_worker(classifier, batch=4, in_flight=1)  # bound 4
    p0, p1 = (TOPIC, 0), (TOPIC, 1)
    consumer.assign(p0, p1)
    consumer.produce(0, 4)
    turn_until(worker, lambda: len(sink.sent) == 4)
    turn_until(worker, lambda: not len(worker.group._committer))
    consumer.answer(ILLEGAL_GENERATION)
    turn_until(worker, lambda: consumer.paused == {p0, p1})
    consumer.revoke(p1)  # its pause stays with the partition, as in librdkafka
    turn_until(worker, lambda: len(consumer.async_commits) > 0)  # p0's retry
    consumer.answer(None)
    turn_until(worker, lambda: p0 not in consumer.paused)  # the worker is not paused now
    assert consumer.paused == {p1}
    consumer.produce(1, 3)
    consumer.events.append(lambda c: c.assign(p1))
    turn_until(worker, lambda: len(sink.sent) == 7)
    assert consumer.paused == set()


def test_a_revoke_commits_again_what_an_unanswered_commit_covered(classifier: DemoModel) -> None:
    """An asynchronous commit still unanswered when its partition is revoked may be
    rejected afterwards, too late to send again: the revoke's commit covers it."""
    worker, consumer, _sink, _ = build_worker(classifier)
    p0, p1 = (TOPIC, 0), (TOPIC, 1)
    consumer.assign(p0, p1)
    consumer.produce(0, 4)
    turn_until(worker, lambda: any(o[0].offset == 4 for o in consumer.async_commits))
    consumer.revoke(p0)
    assert (TOPIC, 0, 4) in consumer.sync_commits[-1]
    assert consumer.group_offsets[p0] == 4
    consumer.answer(ILLEGAL_GENERATION)  # the old commit's answer, late
    assert worker.group._delivery.records_in_flight() == 0
    assert worker.group._delivery.settled()


def test_a_one_round_rebalance_hands_every_partition_over_at_its_committed_offset(
    classifier: DemoModel,
) -> None:
    """``assignor = "roundrobin"`` revokes every partition and assigns a share back in the
    same rebalance: what was published is committed before the partitions go (their next
    owner starts right after it), and the kept partitions go on from their committed
    offsets, so nothing is published twice and nothing is skipped."""
    worker, consumer, sink, _ = build_worker(classifier)
    every = [(TOPIC, p) for p in range(4)]
    consumer.assign(*every)
    for p in range(4):
        consumer.produce(p, 12)
    turn_until(worker, lambda: len(sink.sent) >= 8)
    consumer.events += [lambda c: c.revoke(*every), lambda c: c.assign((TOPIC, 1), (TOPIC, 3))]
    worker.run_once()
    for p in (0, 2):
        ids = [i for i in (orjson.loads(v)["id"] for _, v in sink.sent) if i.startswith(f"r{p}-")]
        assert ids == [f"r{p}-{i}" for i in range(len(ids))]
        assert consumer.group_offsets.get((TOPIC, p), 0) == len(ids)

    def kept() -> list[str]:
        ids = (orjson.loads(v)["id"] for _, v in sink.sent)
        return sorted(i for i in ids if i.startswith(("r1-", "r3-")))

    turn_until(worker, lambda: len(kept()) >= 24)
    assert kept() == sorted(f"r{p}-{i}" for p in (1, 3) for i in range(12))


def test_a_stop_commits_what_unanswered_commits_covered(classifier: DemoModel) -> None:
    worker, consumer, _sink, _ = build_worker(classifier)
    consumer.assign((TOPIC, 0))
    consumer.produce(0, 6)
    turn_until(worker, lambda: any(o[0].offset == 6 for o in consumer.async_commits))
    worker.stop()
    worker.run()
    assert consumer.sync_commits[-1] == [(TOPIC, 0, 6)]
    assert consumer.group_offsets[(TOPIC, 0)] == 6


def test_a_stop_during_a_rebalance_commits_once_the_group_settles(classifier: DemoModel) -> None:
    """Scaling in two workers at once: the second one's last commit meets the rebalance
    the first one's leaving started, and the broker refuses it for a while."""
    worker, consumer, sink, _ = build_worker(classifier)
    consumer.assign((TOPIC, 0), (TOPIC, 1))
    consumer.produce(0, 5)
    consumer.produce(1, 3)
    turn_until(worker, lambda: len(sink.sent) == 8)
    consumer.refusals += [
        KafkaError(KafkaError.REBALANCE_IN_PROGRESS),
        KafkaError(KafkaError.ILLEGAL_GENERATION),
    ]
    worker.stop()
    worker.run()
    assert not consumer.refusals
    assert consumer.group_offsets == {(TOPIC, 0): 5, (TOPIC, 1): 3}
    assert consumer.paused == {(TOPIC, 0), (TOPIC, 1)}  # nothing new came in meanwhile


def test_a_stop_refused_until_the_deadline_fails_naming_it(classifier: DemoModel) -> None:
    worker, consumer, sink, _ = build_worker(classifier, shutdown_timeout_s=0.5)
    consumer.assign((TOPIC, 0))
    consumer.produce(0, 4)
    turn_until(worker, lambda: len(sink.sent) == 4)
    consumer.refusals += [KafkaError(KafkaError.REBALANCE_IN_PROGRESS)] * 1000
    worker.stop()
    with pytest.raises(CommitError, match="last commit was refused until the shutdown deadline"):
        worker.run()


def test_a_fatal_client_error_reported_only_to_error_cb_stops_the_worker(
    classifier: DemoModel,
) -> None:
    """librdkafka reports some fatal errors (a refused group_instance_id under KIP-848)
    only through ``error_cb``; a worker that went on would own nothing, for good."""
    worker, consumer, _sink, _ = build_worker(classifier)
    consumer.assign((TOPIC, 0))
    worker.run_once()
    unreleased = KafkaError(
        KafkaError.UNRELEASED_INSTANCE_ID, "The instance ID is still used", fatal=True
    )
    worker.group._events.on_error(KafkaError(KafkaError._TRANSPORT, "not fatal"))
    worker.run_once()  # a passing client error changes nothing
    worker.group._events.on_error(unreleased)
    with pytest.raises(SourceError) as stopped:
        worker.run_once()
    message = str(stopped.value)
    assert "fatal consumer error" in message and "still used" in message
    assert "group.consumer.session.timeout.ms" in message, "what a restart waits for"
