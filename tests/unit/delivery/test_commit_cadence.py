"""Commit cadence and in-flight accounting under a steady stream of tiny batches.

A simulated second is hundreds of one-record batches (adaptive batching at a light load
hands every record over on its own); the broker answers commits one after another, each
taking a few milliseconds, as a group coordinator on a busy core does. Time comes from
an injected clock, so nothing here depends on the machine's speed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from confluent_kafka import TopicPartition

from tests.fakes.jobs import deliver, job, sent
from tests.fakes.worker import FakeConsumer
from worker.core.types import PartitionKey
from worker.delivery.committer import CommitAnswers, Committer
from worker.loop.pausing import PausingManager

PARTITIONS = 4
BOUND = 1024  # max_in_flight_batches 4 x max_batch_size 256


@dataclass
class SlowBroker(FakeConsumer):
    """Answers asynchronous commits in order, ``answer_s`` of its time each."""

    now: list[float] = field(default_factory=lambda: [0.0])
    answer_s: float = 0.004
    answers: CommitAnswers = field(default_factory=CommitAnswers)
    _queue: deque[tuple[float, list[TopicPartition]]] = field(default_factory=deque)
    _free_at: float = 0.0

    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: bool
    ) -> list[TopicPartition] | None:
        answer = super().commit(offsets=offsets, asynchronous=asynchronous)
        if asynchronous:
            self._free_at = max(self._free_at, self.now[0]) + self.answer_s
            self._queue.append((self._free_at, offsets))
        return answer

    def answer_due(self) -> None:
        """Hand over the answers ready by now (librdkafka does inside ``consume``)."""
        while self._queue and self._queue[0][0] <= self.now[0]:
            _, offsets = self._queue.popleft()
            self.answers(
                None, [TopicPartition(tp.topic, tp.partition, tp.offset) for tp in offsets]
            )


@dataclass
class Switch:
    paused: list[set[PartitionKey]] = field(default_factory=list)

    def pause(self, partitions: set[PartitionKey]) -> None:
        self.paused.append(partitions)

    def resume(self, partitions: set[PartitionKey]) -> None:
        return None


def committer_on(broker: SlowBroker, interval: float = 0.1) -> Committer:
    return Committer(broker, answers=broker.answers, clock=lambda: broker.now[0], interval=interval)


def stream(
    broker: SlowBroker,
    committer: Committer,
    *,
    seconds: float,
    batches_per_s: int,
    records: int = 1,
    pausing: PausingManager | None = None,
) -> int:
    """Batches of ``records`` at ``batches_per_s``, each delivered at once, the loop
    committing after every one; returns the most records ever counted in flight."""
    owned = {("req", p) for p in range(PARTITIONS)}
    step = 1.0 / batches_per_s
    next_offset = [0] * PARTITIONS
    most = 0
    for n in range(int(seconds * batches_per_s)):
        broker.now[0] = n * step
        broker.answer_due()
        partition = n % PARTITIONS
        next_offset[partition] += records
        tracker = sent(1)
        key = ("req", partition)
        committer.track(job(tracker, {key: next_offset[partition]}, {key: records}))
        deliver(tracker)
        committer.commit_ready()
        counted = committer.records
        most = max(most, counted)
        if pausing is not None:
            pausing.update(counted, owned, len(committer))
    return most


def test_tiny_batches_at_500_per_second_never_pause_the_worker() -> None:
    """The stall: one commit per one-record batch outran the broker's answers; every
    commit unanswered for half a second counted its records as in flight, and the
    bound paused all partitions with no batch in flight at all."""
    broker = SlowBroker()
    switch = Switch()
    pausing = PausingManager(switch, BOUND)
    committer = committer_on(broker)
    most = stream(broker, committer, seconds=20, batches_per_s=500, pausing=pausing)
    assert switch.paused == [], f"paused with {most} records counted in flight"
    assert most <= 1, "only the batch not yet retired is unfinished"


def test_commits_per_second_do_not_grow_with_the_batch_rate() -> None:
    rates = {}
    for batches_per_s, records in ((16, 32), (512, 1), (4096, 1)):  # steps exact in binary
        broker = SlowBroker(answer_s=0.0)
        committer = committer_on(broker, interval=0.125)
        stream(broker, committer, seconds=10, batches_per_s=batches_per_s, records=records)
        rates[batches_per_s] = len(broker.commits) / 10
    assert rates[16] == rates[512] == rates[4096] == 8.0, rates


def test_coalesced_commit_carries_the_highest_offset_of_each_partition() -> None:
    broker = SlowBroker()
    committer = committer_on(broker, interval=0.1)
    stream(broker, committer, seconds=0.25, batches_per_s=40)  # offsets 1, 2, 3 per partition
    assert [offsets for offsets, _ in broker.commits] == [
        [("req", 0, 1)],  # the first commit goes at once
        [("req", 0, 2), ("req", 1, 1), ("req", 2, 1), ("req", 3, 1)],
        [("req", 0, 3), ("req", 1, 2), ("req", 2, 2), ("req", 3, 2)],
    ]


def test_records_count_until_delivered_then_not_while_the_commit_waits() -> None:
    broker = SlowBroker()
    committer = committer_on(broker, interval=0.1)
    committer.track(job(tracker := sent(1), {("req", 0): 1}, {("req", 0): 1}))
    committer.commit_ready()
    assert committer.records == 1, "undelivered: a crash would consume it again"
    committer.track(job(second := sent(1), {("req", 0): 10}, {("req", 0): 9}))
    deliver(tracker)
    committer.commit_ready()  # the first commit of the run goes at once
    assert committer.records == 9
    broker.now[0] = 0.05
    deliver(second)
    committer.commit_ready()
    assert broker.commits == [([("req", 0, 1)], True)], "held for the interval"
    assert committer.records == 0, "delivered: nothing of it is unfinished"
    assert len(committer) == 0
    assert not committer.confirmed_all(), "its offset is not committed yet"
    broker.now[0] = 0.1
    committer.commit_ready()
    assert broker.commits[-1] == ([("req", 0, 10)], True)


def test_a_commit_never_passes_an_undelivered_batch() -> None:
    broker = SlowBroker()
    committer = committer_on(broker, interval=0.1)
    first, second = sent(1), sent(1)
    committer.track(job(first, {("req", 0): 5}, {("req", 0): 5}))
    committer.track(job(second, {("req", 0): 9}, {("req", 0): 4}))
    deliver(second)
    broker.now[0] = 1.0
    committer.commit_ready()
    committer.commit_ready(asynchronous=False)
    assert broker.commits == []
    assert committer.records == 9


def test_a_synchronous_commit_sends_what_waits_for_the_interval() -> None:
    """Revoke and stop commit what finished, whatever the interval."""
    broker = SlowBroker()
    committer = committer_on(broker, interval=60.0)
    for offset in (3, 7):
        committer.track(job(tracker := sent(1), {("req", 0): offset}, {("req", 0): 1}))
        deliver(tracker)
        committer.commit_ready()
    assert broker.commits == [([("req", 0, 3)], True)]
    committer.commit_unconfirmed()
    assert broker.commits[-1] == ([("req", 0, 7)], False)
    assert committer.confirmed_all()


def test_partitions_that_leave_take_their_waiting_offsets_with_them() -> None:
    """Lost partitions may have a new owner already: nothing of theirs is committed."""
    broker = SlowBroker()
    committer = committer_on(broker, interval=60.0)
    committer.track(job(tracker := sent(1), {("req", 0): 1, ("req", 1): 1}))
    deliver(tracker)
    committer.commit_ready()  # the first goes at once
    committer.track(job(tracker := sent(1), {("req", 0): 4, ("req", 1): 6}))
    deliver(tracker)
    committer.commit_ready()
    committer.forget([("req", 1)])
    committer.commit_ready(asynchronous=False)
    assert broker.commits[-1] == ([("req", 0, 4)], False)


def test_interval_zero_commits_after_every_delivered_batch() -> None:
    broker = SlowBroker(answer_s=0.0)
    committer = committer_on(broker, interval=0.0)
    stream(broker, committer, seconds=1, batches_per_s=100)
    assert len(broker.commits) == 100
