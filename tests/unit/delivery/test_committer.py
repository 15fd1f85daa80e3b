"""The committer: commits the delivered prefix of batches, in order, never backwards."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from tests.fakes.jobs import deliver, job, sent
from tests.fakes.worker import FakeConsumer
from worker.core.job import Job
from worker.core.tracker import DeliveryTracker
from worker.core.types import PartitionKey
from worker.delivery.committer import STALLED_COMMIT_S, CommitAnswers, Committer
from worker.errors import CommitError, SinkError


@pytest.fixture
def consumer() -> FakeConsumer:
    return FakeConsumer()


@pytest.fixture
def committer(consumer: FakeConsumer) -> Committer:
    return Committer(consumer)


# --- DeliveryTracker -------------------------------------------------------------------


def test_unsealed_tracker_is_never_done() -> None:
    t = DeliveryTracker()
    t.sent = 1
    deliver(t)
    assert not t.done  # more records may still be sent for this batch
    t.seal()
    assert t.done


def test_tracker_counts_deliveries() -> None:
    t = sent(2)
    assert not t.done
    deliver(t)
    assert not t.done
    deliver(t)
    assert t.done
    assert t.errors == []


def test_tracker_keeps_errors_with_location() -> None:
    t = sent(1)
    t.on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT), Message(topic="out", partition=3))
    assert t.done
    assert len(t.errors) == 1
    assert t.errors[0].startswith("out[3]: ")


def test_tracker_caps_error_list() -> None:
    t = sent(25)
    deliver(t, 25, KafkaError(KafkaError._MSG_TIMED_OUT))
    assert t.done
    assert len(t.errors) == 10


def test_tracker_refused_counts_as_failed_delivery() -> None:
    t = sent(1)
    t.refused_by_producer("res", "Message size too large")
    assert t.done
    assert t.errors == ["res: refused by producer: Message size too large"]


# --- Committer -------------------------------------------------------------------------


def test_commits_a_delivered_batch(committer: Committer, consumer: FakeConsumer) -> None:
    t = sent(2)
    committer.track(job(t, {("req", 0): 11, ("req", 1): 5}))
    assert committer.commit_ready() == 0
    assert consumer.commits == []
    deliver(t, 2)
    assert committer.commit_ready() == 1
    assert consumer.stored == [[("req", 0, 11), ("req", 1, 5)]]
    assert consumer.commits == [([("req", 0, 11), ("req", 1, 5)], True)]
    assert committer.committed() == {("req", 0): 11, ("req", 1): 5}
    assert len(committer) == 0


def test_synchronous_commit_is_passed_through(committer: Committer, consumer: FakeConsumer) -> None:
    t = sent(0)
    committer.track(job(t, {("req", 0): 1}))
    assert committer.commit_ready(asynchronous=False) == 1
    assert consumer.commits == [([("req", 0, 1)], False)]


def test_later_batch_waits_for_earlier(committer: Committer, consumer: FakeConsumer) -> None:
    first, second = sent(1), sent(1)
    committer.track(job(first, {("req", 0): 10}))
    committer.track(job(second, {("req", 0): 20}))
    deliver(second)  # batch 2 is done, batch 1 still pending
    assert committer.commit_ready() == 0
    assert consumer.commits == []
    assert consumer.stored == []
    assert len(committer) == 2
    deliver(first)
    assert committer.commit_ready() == 2
    # both batches in one commit, with the highest offset
    assert consumer.commits == [([("req", 0, 20)], True)]
    assert committer.committed() == {("req", 0): 20}


def test_counts_the_records_in_flight(committer: Committer) -> None:
    first, second = sent(1), sent(1)
    committer.track(job(first, {("req", 0): 10}, {("req", 0): 100}))
    committer.track(job(second, {("req", 0): 20}, {("req", 0): 7}))
    assert committer.records == 107
    deliver(first)
    committer.commit_ready()
    assert committer.records == 7
    committer.clear()
    assert committer.records == 0


def test_commits_only_the_delivered_prefix(committer: Committer, consumer: FakeConsumer) -> None:
    a, b, c = sent(1), sent(1), sent(1)
    committer.track(job(a, {("req", 0): 3}))
    committer.track(job(b, {("req", 1): 7}))
    committer.track(job(c, {("req", 0): 9}))
    deliver(a)
    deliver(c)
    assert committer.commit_ready() == 1
    assert consumer.commits == [([("req", 0, 3)], True)]
    assert len(committer) == 2
    deliver(b)
    assert committer.commit_ready() == 2
    assert consumer.commits[-1] == ([("req", 0, 9), ("req", 1, 7)], True)
    assert len(consumer.commits) == 2


def test_merges_max_offset_per_partition(committer: Committer, consumer: FakeConsumer) -> None:
    for offsets in ({("a", 0): 5, ("b", 2): 40}, {("a", 0): 9}, {("a", 1): 1, ("b", 2): 41}):
        committer.track(job(sent(0), dict(offsets)))
    assert committer.commit_ready() == 3
    assert consumer.commits == [([("a", 0, 9), ("a", 1, 1), ("b", 2, 41)], True)]


def test_nothing_to_commit(committer: Committer, consumer: FakeConsumer) -> None:
    assert committer.commit_ready() == 0
    assert consumer.commits == []


def test_failed_delivery_raises_and_is_not_committed(
    committer: Committer, consumer: FakeConsumer
) -> None:
    t = sent(2)
    committer.track(job(t, {("req", 0): 50}))
    deliver(t)
    deliver(t, err=KafkaError(KafkaError._MSG_TIMED_OUT))
    with pytest.raises(SinkError, match=r"1 deliveries of a batch failed"):
        committer.commit_ready()
    assert consumer.commits == []
    assert consumer.stored == []
    assert committer.committed() == {}
    # stays failed: a later call still refuses
    with pytest.raises(SinkError):
        committer.commit_ready()


def test_refused_record_blocks_commit(committer: Committer, consumer: FakeConsumer) -> None:
    t = sent(1)
    t.refused_by_producer("res", "Broker: Message size too large")
    committer.track(job(t, {("req", 0): 5}))
    with pytest.raises(SinkError, match="Message size too large"):
        committer.commit_ready()
    assert consumer.commits == []


def test_failed_batch_blocks_later_batches(committer: Committer, consumer: FakeConsumer) -> None:
    bad, good = sent(1), sent(1)
    committer.track(job(bad, {("req", 0): 10}))
    committer.track(job(good, {("req", 0): 20}))
    deliver(bad, err=KafkaError(KafkaError._MSG_TIMED_OUT))
    deliver(good)
    with pytest.raises(SinkError):
        committer.commit_ready()
    assert consumer.commits == []


def test_delivered_batches_before_a_failed_one_are_committed(
    committer: Committer, consumer: FakeConsumer
) -> None:
    good, bad = sent(1), sent(1)
    committer.track(job(good, {("req", 0): 10}))
    committer.track(job(bad, {("req", 0): 20}))
    deliver(good)
    deliver(bad, err=KafkaError(KafkaError._MSG_TIMED_OUT))
    with pytest.raises(SinkError):
        committer.commit_ready()
    # Synchronous: the worker stops right after, so the commit must land first.
    assert consumer.commits == [([("req", 0, 10)], False)]


def test_refuses_to_move_backwards(committer: Committer, consumer: FakeConsumer) -> None:
    committer.track(job(sent(0), {("req", 0): 100, ("req", 1): 3}))
    committer.commit_ready()
    committer.track(job(sent(0), {("req", 0): 60, ("req", 1): 4}))
    assert committer.commit_ready() == 1
    assert consumer.commits[-1] == ([("req", 1, 4)], True)
    assert committer.committed() == {("req", 0): 100, ("req", 1): 4}


def test_backwards_only_commits_nothing(committer: Committer, consumer: FakeConsumer) -> None:
    committer.track(job(sent(0), {("req", 0): 100}))
    committer.commit_ready()
    committer.track(job(sent(0), {("req", 0): 99}))
    assert committer.commit_ready() == 1
    assert len(consumer.commits) == 1


def test_forget_drops_partitions_from_pending_batches(
    committer: Committer, consumer: FakeConsumer
) -> None:
    t1, t2 = sent(0), sent(1)
    committer.track(job(t1, {("req", 0): 100}))
    committer.commit_ready()
    committer.track(job(t2, {("req", 0): 120, ("req", 1): 8}))
    committer.forget([("req", 0)])
    assert committer.committed() == {}
    deliver(t2)
    assert committer.commit_ready() == 1
    assert consumer.commits[-1] == ([("req", 1, 8)], True)
    # after re-assignment, an older offset of the forgotten partition is accepted again
    committer.track(job(sent(0), {("req", 0): 50}))
    committer.commit_ready()
    assert committer.committed()[("req", 0)] == 50


def test_forget_leaves_other_partitions(committer: Committer) -> None:
    keep: PartitionKey = ("req", 1)
    committer.track(job(sent(0), {keep: 4, ("req", 2): 6}))
    committer.commit_ready()
    committer.forget([("req", 2), ("other", 0)])
    assert committer.committed() == {keep: 4}


def test_kafka_failure_becomes_commit_error(committer: Committer, consumer: FakeConsumer) -> None:
    consumer.fail_with = KafkaException(KafkaError(KafkaError._NO_OFFSET))
    committer.track(job(sent(0), {("req", 0): 1}))
    with pytest.raises(CommitError, match="commit of 1 partitions failed"):
        committer.commit_ready()
    assert consumer.commits == []


# --- asynchronous commits the broker rejected ------------------------------------------


def test_rejected_commit_is_sent_again(committer: Committer, consumer: FakeConsumer) -> None:
    committer.track(job(sent(0), {("req", 0): 10, ("req", 1): 4}))
    committer.commit_ready()
    committer.requeue_failed([TopicPartition("req", 0, 10)])
    assert committer.commit_ready() == 0  # no new batch, but the retry goes out
    assert consumer.commits[-1] == ([("req", 0, 10)], True)
    assert committer.committed() == {("req", 0): 10, ("req", 1): 4}
    assert committer.commit_ready() == 0
    assert len(consumer.commits) == 2  # sent once, not on every call


def test_rejected_commit_merges_with_newer_batch(
    committer: Committer, consumer: FakeConsumer
) -> None:
    committer.track(job(sent(0), {("req", 0): 10}))
    committer.commit_ready()
    committer.requeue_failed([TopicPartition("req", 0, 10)])
    committer.track(job(sent(0), {("req", 0): 15, ("req", 1): 2}))
    assert committer.commit_ready() == 1
    assert consumer.commits[-1] == ([("req", 0, 15), ("req", 1, 2)], True)


def test_stale_rejection_is_ignored(committer: Committer, consumer: FakeConsumer) -> None:
    committer.track(job(sent(0), {("req", 0): 10}))
    committer.commit_ready()
    committer.track(job(sent(0), {("req", 0): 20}))
    committer.commit_ready()
    committer.requeue_failed([TopicPartition("req", 0, 10)])  # superseded by 20
    assert committer.commit_ready() == 0
    assert len(consumer.commits) == 2
    assert committer.committed() == {("req", 0): 20}


def test_forget_drops_pending_retry(committer: Committer, consumer: FakeConsumer) -> None:
    committer.track(job(sent(0), {("req", 0): 10}))
    committer.commit_ready()
    committer.requeue_failed([TopicPartition("req", 0, 10)])
    committer.forget([("req", 0)])
    assert committer.commit_ready() == 0
    assert len(consumer.commits) == 1


# --- what a crash would replay: rejected commits count until redone ------------------


def _answer(offsets: dict[PartitionKey, int]) -> list[TopicPartition]:
    return [TopicPartition(t, p, offset) for (t, p), offset in offsets.items()]


REBALANCING = KafkaError(KafkaError.REBALANCE_IN_PROGRESS)


def test_rejected_commit_counts_its_records_until_a_later_commit_succeeds(
    committer: Committer, consumer: FakeConsumer
) -> None:
    committer.track(job(sent(0), {("req", 0): 10, ("req", 1): 4}, {("req", 0): 30, ("req", 1): 20}))
    committer.commit_ready()
    assert committer.records == 0  # sent: nothing left to replay if it succeeds
    failed = committer.settle(REBALANCING, _answer({("req", 0): 10, ("req", 1): 4}))
    assert [(tp.partition, tp.offset) for tp in failed] == [(0, 10), (1, 4)]
    assert committer.records == 50, "a crash now would replay them"
    committer.track(job(sent(0), {("req", 0): 12}, {("req", 0): 5}))
    committer.commit_ready()  # the retry goes out with the newer batch
    assert consumer.commits[-1] == ([("req", 0, 12), ("req", 1, 4)], True)
    assert committer.records == 50
    assert committer.settle(None, _answer({("req", 0): 12, ("req", 1): 4})) == []
    assert committer.records == 0


def test_partly_redone_commit_still_counts(committer: Committer) -> None:
    committer.track(job(sent(0), {("req", 0): 10, ("req", 1): 4}, {("req", 0): 30, ("req", 1): 20}))
    committer.commit_ready()
    committer.settle(REBALANCING, _answer({("req", 0): 10, ("req", 1): 4}))
    committer.settle(None, _answer({("req", 0): 10}))
    assert committer.records == 50, "partition 1 is still uncommitted"
    committer.settle(None, _answer({("req", 1): 4}))
    assert committer.records == 0


def test_good_answers_change_nothing(committer: Committer) -> None:
    committer.track(job(sent(0), {("req", 0): 10}, {("req", 0): 50}))
    committer.track(job(sent(1), {("req", 0): 20}, {("req", 0): 7}))
    committer.commit_ready()
    assert committer.settle(None, _answer({("req", 0): 10})) == []
    assert committer.records == 7
    # an answer to a commit the committer did not send (a synchronous one, say)
    assert committer.settle(None, _answer({("req", 3): 99})) == []
    assert committer.records == 7


def _reject_a_commit_of_50_records(committer: Committer) -> None:
    committer.track(job(sent(0), {("req", 0): 10}, {("req", 0): 50}))
    committer.commit_ready()
    committer.settle(REBALANCING, _answer({("req", 0): 10}))


def test_revoked_partitions_release_their_rejected_records(committer: Committer) -> None:
    _reject_a_commit_of_50_records(committer)
    assert committer.records == 50
    committer.forget([("req", 0)])  # the new owner consumes them
    assert committer.records == 0


def test_clear_forgets_rejected_commits(committer: Committer) -> None:
    _reject_a_commit_of_50_records(committer)
    assert committer.records == 50
    committer.clear()
    assert committer.records == 0


def test_unanswered_commit_counts_once_stalled(consumer: FakeConsumer) -> None:
    now = [100.0]
    committer = Committer(consumer, clock=lambda: now[0])
    committer.track(job(sent(0), {("req", 0): 10}, {("req", 0): 50}))
    committer.commit_ready()
    assert committer.records == 0  # answers take milliseconds
    now[0] += STALLED_COMMIT_S
    assert committer.records == 50, "held back during a rebalance: a crash would replay them"
    committer.track(job(sent(0), {("req", 0): 12}, {("req", 0): 5}))
    committer.commit_ready()
    assert committer.records == 50  # the newer commit is not stalled yet
    now[0] += STALLED_COMMIT_S
    assert committer.records == 55
    assert committer.settle(None, _answer({("req", 0): 10})) == []
    assert committer.records == 5
    assert committer.settle(None, _answer({("req", 0): 12})) == []
    assert committer.records == 0


def test_a_later_good_commit_settles_older_unanswered_ones(consumer: FakeConsumer) -> None:
    now = [0.0]
    committer = Committer(consumer, clock=lambda: now[0])
    committer.track(job(sent(0), {("req", 0): 10}, {("req", 0): 50}))
    committer.commit_ready()
    committer.track(job(sent(0), {("req", 0): 12}, {("req", 0): 5}))
    committer.commit_ready()
    now[0] += 1.0
    committer.settle(None, _answer({("req", 0): 12}))
    assert committer.records == 0, "offset 12 covers 10"


# --- synchronous commits (the revoke path): their answer is the return value ----------

ILLEGAL_GENERATION = KafkaError(KafkaError.ILLEGAL_GENERATION)


def _two_partitions_rejected(committer: Committer) -> None:
    """Two partitions tracked and committed asynchronously, both commits rejected while
    the group rebalances (as after a member is killed)."""
    committer.track(job(sent(0), {("req", 2): 429}, {("req", 2): 150}))
    committer.track(job(sent(0), {("req", 3): 453}, {("req", 3): 196}))
    committer.commit_ready()
    committer.settle(ILLEGAL_GENERATION, _answer({("req", 2): 429, ("req", 3): 453}))
    assert committer.records == 346


def test_a_good_synchronous_commit_releases_the_records_of_rejected_ones(
    committer: Committer, consumer: FakeConsumer
) -> None:
    _two_partitions_rejected(committer)
    committer.commit_ready(asynchronous=False)  # the revoke of partition 2 takes both retries
    assert consumer.commits[-1] == ([("req", 2, 429), ("req", 3, 453)], False)
    committer.forget([("req", 2)])
    assert committer.records == 0, "the synchronous commit confirmed partition 3's offset"
    assert committer.commit_ready() == 0
    assert len(consumer.commits) == 2, "nothing is left to send again"


def test_a_partition_rejected_in_a_synchronous_answer_is_sent_again(
    committer: Committer, consumer: FakeConsumer
) -> None:
    _two_partitions_rejected(committer)
    consumer.rejects[("req", 3)] = ILLEGAL_GENERATION
    committer.commit_ready(asynchronous=False)
    committer.forget([("req", 2)])
    assert committer.records == 196, "partition 3 is still uncommitted"
    consumer.rejects.clear()
    committer.commit_ready()
    assert consumer.commits[-1] == ([("req", 3, 453)], True)
    committer.settle(None, _answer({("req", 3): 453}))
    assert committer.records == 0


def test_a_synchronous_commit_that_raises_keeps_its_offsets_for_the_next_commit(
    committer: Committer, consumer: FakeConsumer
) -> None:
    _two_partitions_rejected(committer)
    consumer.fail_with = KafkaException(KafkaError(KafkaError.REBALANCE_IN_PROGRESS))
    with pytest.raises(CommitError):
        committer.commit_ready(asynchronous=False)
    committer.forget([("req", 2)])  # the revoke goes on without it
    consumer.fail_with = None
    assert committer.records == 196
    committer.commit_ready()
    assert consumer.commits[-1] == ([("req", 3, 453)], True), "the kept partition goes again"
    committer.settle(None, _answer({("req", 3): 453}))
    assert committer.records == 0


def test_a_new_batch_committed_synchronously_that_raises_counts_until_redone(
    committer: Committer, consumer: FakeConsumer
) -> None:
    committer.track(job(sent(0), {("req", 0): 10}, {("req", 0): 40}))
    consumer.fail_with = KafkaException(KafkaError(KafkaError.REBALANCE_IN_PROGRESS))
    with pytest.raises(CommitError):
        committer.commit_ready(asynchronous=False)
    assert committer.records == 40, "a crash now would replay them"
    consumer.fail_with = None
    committer.commit_ready(asynchronous=False)
    assert consumer.commits[-1] == ([("req", 0, 10)], False)
    assert committer.records == 0


def test_an_answer_for_a_commit_trimmed_by_a_revoke_still_settles_it(
    committer: Committer, consumer: FakeConsumer
) -> None:
    committer.track(job(sent(0), {("req", 0): 10, ("req", 1): 4}, {("req", 0): 30, ("req", 1): 20}))
    committer.commit_ready()
    committer.forget([("req", 1)])
    failed = committer.settle(REBALANCING, _answer({("req", 0): 10, ("req", 1): 4}))
    assert [(tp.partition, tp.offset) for tp in failed] == [(0, 10)], "1 is no longer ours"
    assert committer.records == 30, "partition 0's records; 1's went with it"
    committer.commit_ready()
    assert consumer.commits[-1] == ([("req", 0, 10)], True)
    committer.settle(None, _answer({("req", 0): 10}))
    assert committer.records == 0


def test_a_pipeline_commits_without_waiting_for_another_pipelines_batches(
    committer: Committer, consumer: FakeConsumer
) -> None:
    """Pipelines read disjoint topics: an interactive batch that went to the model ahead of
    an earlier bulk one commits at once; each pipeline's own batches still commit in order."""
    bulk0, bulk1, live = sent(1), sent(1), sent(1)
    committer.track(Job("bulk", [], bulk0, {("bulk", 0): 256}, counts={("bulk", 0): 256}))
    committer.track(Job("bulk", [], bulk1, {("bulk", 0): 512}, counts={("bulk", 0): 256}))
    committer.track(Job("live", [], live, {("live", 0): 3}, counts={("live", 0): 3}))
    assert (committer.records_of("bulk"), committer.records_of("live")) == (512, 3)
    deliver(live)
    deliver(bulk1)
    assert committer.commit_ready() == 1
    assert consumer.commits == [([("live", 0, 3)], True)]
    assert (committer.records, committer.records_of("live"), len(committer)) == (512, 0, 2)
    deliver(bulk0)
    assert committer.commit_ready() == 2
    assert consumer.commits[-1] == ([("bulk", 0, 512)], True)
    assert (committer.records, committer.records_of("bulk"), len(committer)) == (0, 0, 0)


def test_a_failed_batch_of_one_pipeline_still_commits_what_another_delivered(
    committer: Committer, consumer: FakeConsumer
) -> None:
    bad, good = sent(1), sent(1)
    committer.track(Job("bulk", [], bad, {("bulk", 0): 10}))
    committer.track(Job("live", [], good, {("live", 0): 4}))
    deliver(bad, err=KafkaError(KafkaError._MSG_TIMED_OUT))
    deliver(good)
    with pytest.raises(SinkError):
        committer.commit_ready()
    assert consumer.commits == [([("live", 0, 4)], False)]


def test_clear_forgets_every_pipelines_records(committer: Committer) -> None:
    committer.track(Job("bulk", [], sent(1), {("bulk", 0): 5}, counts={("bulk", 0): 5}))
    committer.track(Job("live", [], sent(1), {("live", 0): 1}, counts={("live", 0): 1}))
    assert committer.clear() == 2
    assert (len(committer), committer.records_of("bulk"), committer.records_of("live")) == (0, 0, 0)


def test_a_partition_refused_in_a_synchronous_answer_is_logged_by_name(
    committer: Committer, consumer: FakeConsumer, caplog: pytest.LogCaptureFixture
) -> None:
    """A revoke commits synchronously; a partition the broker refuses there is repeated
    by its next owner, so the log says which one and why."""
    committer.track(job(sent(0), {("req", 2): 429, ("req", 3): 453}, {("req", 2): 1}))
    consumer.rejects[("req", 3)] = ILLEGAL_GENERATION
    with caplog.at_level("WARNING", logger="worker.delivery.committer"):
        committer.commit_ready(asynchronous=False)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "req[3]@453" in warning and "req[2]" not in warning
    assert ILLEGAL_GENERATION.str() in warning
    assert not committer.confirmed_all()


def test_answers_from_on_commit_are_settled_before_the_committer_next_looks(
    consumer: FakeConsumer, caplog: pytest.LogCaptureFixture
) -> None:
    """librdkafka hands answers to the queue inside ``consume``; the committer takes them,
    in order, before it reports or changes anything, as if it had been called back."""
    answers = CommitAnswers()
    rejected: list[int] = []
    committer = Committer(consumer, answers=answers, on_rejected=lambda: rejected.append(1))
    committer.track(job(sent(0), {("req", 0): 10}, {("req", 0): 30}))
    committer.commit_ready()
    answers(REBALANCING, _answer({("req", 0): 10}))
    assert answers.waiting(), "nothing is settled inside the callback"
    assert committer.records == 30, "the rejection counts at the next look"
    assert not answers.waiting()
    assert rejected == [1]
    assert "commit of 1 partitions rejected" in caplog.text
    committer.commit_ready()  # the retry
    assert consumer.commits[-1] == ([("req", 0, 10)], True)
    answers(None, _answer({("req", 0): 10}))
    assert committer.confirmed_all()
    assert committer.records == 0
    assert rejected == [1]


def test_an_empty_answer_queue_handed_in_is_the_one_used(consumer: FakeConsumer) -> None:
    answers = CommitAnswers()
    assert answers, "an empty queue is still a queue: never taken for 'none given'"
    committer = Committer(consumer, answers=answers)
    committer.track(job(sent(0), {("req", 0): 10}, {("req", 0): 30}))
    committer.commit_ready()
    answers(REBALANCING, _answer({("req", 0): 10}))
    assert committer.records == 30
