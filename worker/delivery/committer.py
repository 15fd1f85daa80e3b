"""Offset commits that follow confirmed delivery.

Batches are committed in the order they were produced, pipeline by pipeline: a batch's
offsets (next offset, i.e. last + 1, per partition) are committed only when its
deliveries and those of every earlier batch of its pipeline have all succeeded.
Pipelines read disjoint topics, so that is every earlier batch of its partitions, and
a pipeline whose batches went to the model first (``worker.loop.lanes``) never waits for
another's to commit. An offset that would move a partition backwards is
refused. Asynchronous commits that the broker rejects (a rebalance was in progress, say)
come back through ``settle`` and are sent again with the next commit. librdkafka hands
those answers to ``CommitAnswers`` inside ``consume``; the committer settles them before
it next reads or changes its state, so it acts on every answer in the order they came. A synchronous
commit is answered only by what ``commit()`` returns (confluent-kafka never passes it to
``on_commit``), and a commit that raises was never made: both are taken the same way, so
a record stays counted only while a retry or an unanswered commit can release it. A failed
delivery stops commits for good: the caller must stop the worker so the uncommitted
records are consumed again.

Commits are coalesced: delivered batches are retired at once, but their offsets go to
the broker at most once every ``interval`` seconds (merged, the highest offset per
partition), so the number of commits follows the clock, never the batch rate. One commit
per tiny batch (adaptive batching at a light load makes every record its own batch)
sent hundreds of commits a second; their answers fell behind, each unanswered commit
counted as in flight once stalled, and the worker paused every partition for seconds at
a tenth of its capacity. A synchronous commit (revoke, stop) sends whatever is pending.

``records`` counts what is really unfinished, which the worker bounds: the records of
batches not yet delivered, those of commits the broker rejected until a later commit of
their partitions succeeds, and those of commits left unanswered for
``STALLED_COMMIT_S``. Records delivered and waiting for the next commit do not count:
the interval bounds how long they wait, and no record waits on a commit to be served.
While the group rebalances, which lasts up to a session timeout when a member died,
librdkafka holds commits back unanswered, or the broker rejects them; counting them
stops a worker from going on for the whole rebalance with nothing committed.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol, overload

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from worker.core import Clock, DeliveryTracker, Job, PartitionKey, monotonic_clock
from worker.errors import CommitError, SinkError

__all__ = ["CommitAnswers", "Committer", "OffsetConsumer"]

log = logging.getLogger(__name__)


class OffsetConsumer(Protocol):
    """The part of ``confluent_kafka.Consumer`` the committer uses."""

    def store_offsets(self, *, offsets: list[TopicPartition]) -> None: ...

    @overload
    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: Literal[True] = ...
    ) -> None: ...

    @overload
    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: Literal[False]
    ) -> list[TopicPartition]: ...


STALLED_COMMIT_S = 0.5
"""An asynchronous commit unanswered this long counts its records as in flight; answers
take milliseconds otherwise."""


class CommitAnswers:
    """The broker's answers to asynchronous commits, as librdkafka's ``on_commit`` hands
    them over (loop thread, inside ``consume``). The consumer needs the callback before it
    exists and the committer needs the consumer: this queue is what both are given."""

    def __init__(self) -> None:
        self._answers: deque[tuple[KafkaError | None, list[TopicPartition]]] = deque()

    def __call__(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        self._answers.append((err, partitions))

    def waiting(self) -> bool:
        """Whether answers came since the last ``take``. (No ``__len__``: a callback that
        is falsy while empty would be taken for "no callback" by ``x or default``.)"""
        return bool(self._answers)

    def take(self) -> list[tuple[KafkaError | None, list[TopicPartition]]]:
        """Every answer since the last call, oldest first."""
        answers = list(self._answers)
        self._answers.clear()
        return answers


@dataclass(slots=True)
class _Unsettled:
    """A commit without a good answer yet, and the records it covers per partition."""

    offsets: dict[PartitionKey, int]
    counts: dict[PartitionKey, int]
    sent_at: float = 0.0

    @property
    def records(self) -> int:
        return sum(self.counts.values())

    def drop(self, keys: set[PartitionKey]) -> int:
        """Forget ``keys``; returns how many records they covered."""
        dropped = 0
        for key in keys.intersection(self.offsets):
            del self.offsets[key]
            dropped += self.counts.pop(key, 0)
        return dropped


class Committer:
    """Tracks batches in flight and commits the delivered prefix."""

    def __init__(
        self,
        consumer: OffsetConsumer,
        *,
        answers: CommitAnswers | None = None,
        transactional: bool = False,
        on_done: Callable[[DeliveryTracker], None] | None = None,
        on_rejected: Callable[[], None] | None = None,
        clock: Clock = monotonic_clock,
        interval: float = 0.0,
    ) -> None:
        """``answers`` is where ``consumer`` puts the broker's answers to asynchronous
        commits. With ``transactional`` the offsets went into each batch's transaction,
        so done batches are only retired here; ``on_done`` sees every retired batch, and
        ``on_rejected`` every asynchronous commit the broker rejected in part. ``interval``
        (seconds, by ``clock``) is the least time between two asynchronous commits."""
        self._consumer = consumer
        self._answers = answers if answers is not None else CommitAnswers()
        self._on_rejected = on_rejected
        self._transactional = transactional
        self._on_done = on_done
        self._clock = clock
        self._queues: dict[str, deque[Job]] = {}
        """Batches in flight, pipeline by pipeline, in the order they were produced."""
        self._jobs = 0
        self._pipeline_records: dict[str, int] = {}
        self._committed: dict[PartitionKey, int] = {}
        self._retry: dict[PartitionKey, int] = {}
        self._awaiting: deque[_Unsettled] = deque()
        self._rejected: list[_Unsettled] = []
        self._confirmed: dict[PartitionKey, int] = {}
        self._records = 0
        self._interval = interval
        self._sent_at = -float("inf")
        self._pending: dict[PartitionKey, int] = {}
        """Offsets of retired batches not sent yet (the next coalesced commit)."""
        self._pending_counts: dict[PartitionKey, int] = {}
        self.commits_sent = 0
        """Commits sent to the broker (asynchronous and synchronous)."""

    def __len__(self) -> int:
        return self._jobs

    @property
    def records(self) -> int:
        """Records a crash now would have consumed again: see the module docstring."""
        self._settle_answers()
        awaiting = self._awaiting
        if not awaiting:
            return self._records
        stalled_before = self._clock() - STALLED_COMMIT_S
        if awaiting[0].sent_at > stalled_before:  # the oldest is recent: all are
            return self._records
        return self._records + sum(e.records for e in awaiting if e.sent_at <= stalled_before)

    def track(self, job: Job) -> None:
        """Register a produced batch: the next offsets it completes, and its records
        (counted until it is committed)."""
        queue = self._queues.get(job.pipeline)
        if queue is None:
            queue = self._queues[job.pipeline] = deque()
        queue.append(job)
        self._jobs += 1
        self._records += job.records
        self._pipeline_records[job.pipeline] = self.records_of(job.pipeline) + job.records

    def records_of(self, pipeline: str) -> int:
        """Records of ``pipeline``'s uncommitted batches (its part of the bound)."""
        return self._pipeline_records.get(pipeline, 0)

    def commit_ready(self, *, asynchronous: bool = True) -> int:
        """Retire every pipeline's leading batches whose deliveries succeeded and commit
        their offsets: synchronously at once, asynchronously once ``interval`` has passed
        since the last commit. Returns the batches retired. Raises SinkError."""
        self._settle_answers()
        merged: dict[PartitionKey, int] = {}
        released: dict[PartitionKey, int] = {}
        done = 0
        failed: Job | None = None
        for pipeline, queue in self._queues.items():
            retired = 0
            while queue and queue[0].tracker.done:
                head = queue[0]
                if head.tracker.errors:
                    if not self._transactional:  # transactional: an abort rewinds instead
                        failed = failed or head
                    break
                queue.popleft()
                retired += head.records
                if self._on_done is not None:
                    self._on_done(head.tracker)
                for tp, offset in head.offsets.items():
                    if offset > merged.get(tp, -1):
                        merged[tp] = offset
                    released[tp] = released.get(tp, 0) + head.counts.get(tp, 0)
                done += 1
            if retired:
                self._records -= retired
                self._pipeline_records[pipeline] -= retired
        self._jobs -= done
        if self._transactional:  # the offsets went into the batches' transactions
            return done
        self._hold(merged, released)
        if failed is not None:
            self._send_pending(asynchronous=False)  # what was delivered is still committed
            raise SinkError(
                f"{len(failed.tracker.errors)} deliveries of a batch failed, not committing: "
                + "; ".join(failed.tracker.errors)
            )
        if self._retry:
            self._hold(self._retry, {})
            self._retry.clear()
        if not asynchronous or self._clock() - self._sent_at >= self._interval:
            self._send_pending(asynchronous)
        return done

    def _hold(
        self, offsets: Mapping[PartitionKey, int], counts: Mapping[PartitionKey, int]
    ) -> None:
        """Add offsets (and the records they release) to the next commit."""
        pending, pending_counts = self._pending, self._pending_counts
        for tp, offset in offsets.items():
            if offset > pending.get(tp, -1):
                pending[tp] = offset
        for tp, count in counts.items():
            pending_counts[tp] = pending_counts.get(tp, 0) + count

    def _send_pending(self, asynchronous: bool) -> None:
        if not self._pending:
            return
        offsets, counts = self._pending, self._pending_counts
        self._pending, self._pending_counts = {}, {}
        self._sent_at = self._clock()
        self._commit(offsets, asynchronous, counts)

    def commit_unconfirmed(self) -> int:
        """Commit synchronously what is ready and every offset the broker has not confirmed
        yet. For partitions about to leave (a revoke, a stop): an asynchronous commit still
        unanswered may yet be rejected, and that answer would come after the partition is
        gone, too late to send it again, so its new owner would repeat those records."""
        retry, confirmed = self._retry, self._confirmed
        for key, offset in self._committed.items():
            if offset > confirmed.get(key, -1) and offset > retry.get(key, -1):
                retry[key] = offset
        return self.commit_ready(asynchronous=False)

    def confirmed_all(self) -> bool:
        """Whether the broker confirmed every offset this worker committed."""
        self._settle_answers()
        confirmed = self._confirmed
        return (
            not self._retry
            and not self._pending
            and all(offset <= confirmed.get(key, -1) for key, offset in self._committed.items())
        )

    def clear(self) -> int:
        """Forget every batch in flight (a rewind to the committed offsets follows)."""
        self._settle_answers()
        dropped = self._jobs
        self._queues.clear()
        self._jobs = 0
        self._pipeline_records.clear()
        self._retry.clear()
        self._awaiting.clear()
        self._rejected.clear()
        self._confirmed.clear()
        self._pending.clear()
        self._pending_counts.clear()
        self._records = 0
        return dropped

    def _settle_answers(self) -> None:
        """Settle the answers ``consume`` brought since the last look; a rejection is sent
        again with the next commit."""
        if not self._answers.waiting():
            return
        for err, partitions in self._answers.take():
            failed = self.settle(err, partitions)
            if failed:
                reason = err.str() if err is not None else str(failed[0].error)
                log.warning(
                    "commit of %d partitions rejected (%s); will retry", len(failed), reason
                )
                if self._on_rejected is not None:
                    self._on_rejected()

    def settle(
        self, err: KafkaError | None, partitions: list[TopicPartition]
    ) -> list[TopicPartition]:
        """The broker's answer to an asynchronous commit (``on_commit``); returns the
        partitions it rejected. Those are committed again with the next commit, and the
        records the commit covered count as in flight until that succeeds."""
        answered = _offsets(partitions)
        # ``forget`` may have trimmed the commit's revoked partitions since it was sent
        entry = next(
            (
                e
                for e in self._awaiting
                if all(answered.get(k) == off for k, off in e.offsets.items())
            ),
            None,
        )
        if entry is not None:
            self._awaiting.remove(entry)
        return self._answer(entry, err, partitions)

    def _answer(
        self, entry: _Unsettled | None, err: KafkaError | None, partitions: list[TopicPartition]
    ) -> list[TopicPartition]:
        """Take the answer to one commit, however it came: ``on_commit`` for an asynchronous
        one, the return value or exception of a synchronous one. Every commit sent must
        come through here, or the records it covers could count as in flight for good."""
        failed = []
        confirmed, owned = self._confirmed, self._committed
        for tp in partitions:
            key = (tp.topic, tp.partition)
            if key not in owned:
                continue  # revoked since: its new owner commits it
            if err is not None or tp.error is not None:
                failed.append(tp)
            else:
                confirmed[key] = max(tp.offset, confirmed.get(key, -1))
        if failed:
            self.requeue_failed(failed)
            if entry is not None:
                offsets = {k: off for k, off in _offsets(failed).items() if k in entry.offsets}
                counts = {k: entry.counts[k] for k in offsets if entry.counts.get(k)}
                if counts:
                    self._rejected.append(_Unsettled(offsets, counts))
                    self._records += sum(counts.values())
        self._release_covered()
        return failed

    def requeue_failed(self, partitions: list[TopicPartition]) -> None:
        """Offsets the broker rejected (from ``on_commit``): send them with the next commit."""
        for tp in partitions:
            key = (tp.topic, tp.partition)
            if self._committed.get(key) == tp.offset:
                self._retry[key] = tp.offset
                self._committed[key] = -1

    def _release_covered(self) -> None:
        """Rejected commits that a later good commit covers no longer count."""
        confirmed = self._confirmed

        def covered(entry: _Unsettled) -> bool:
            return all(confirmed.get(k, -1) >= off for k, off in entry.offsets.items())

        for entry in [e for e in self._rejected if covered(e)]:
            self._rejected.remove(entry)
            self._records -= entry.records
        while self._awaiting and covered(self._awaiting[0]):
            self._awaiting.popleft()  # superseded: its answer changes nothing

    def _commit(
        self,
        offsets: dict[PartitionKey, int],
        asynchronous: bool,
        counts: Mapping[PartitionKey, int] | None = None,
    ) -> None:
        committed = self._committed
        forward = []
        for (topic, partition), offset in offsets.items():
            previous = committed.get((topic, partition), -1)
            if offset < previous:
                log.error(
                    "refusing to commit %s[%d] backwards: %d < %d",
                    topic,
                    partition,
                    offset,
                    previous,
                )
                continue
            committed[(topic, partition)] = offset
            forward.append(TopicPartition(topic, partition, offset))
        if not forward:
            return
        sending = _offsets(forward)
        counts = counts or {}
        entry = _Unsettled(sending, {k: counts[k] for k in sending if counts.get(k)}, self._clock())
        self.commits_sent += 1
        try:
            self._consumer.store_offsets(offsets=forward)
            answer = (
                self._consumer.commit(offsets=forward, asynchronous=True)
                if asynchronous
                else self._consumer.commit(offsets=forward, asynchronous=False)
            )
        except KafkaException as exc:
            # Nothing was committed: the offsets go out again with the next commit and
            # their records count as in flight until then.
            error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            self._answer(entry, error or KafkaError(KafkaError._FAIL, str(exc)), forward)
            raise CommitError(f"commit of {len(forward)} partitions failed: {exc}") from exc
        if asynchronous:
            self._awaiting.append(entry)
        else:
            # confluent-kafka answers a synchronous commit only here, never via on_commit
            refused = self._answer(entry, None, forward if answer is None else answer)
            if refused:
                log.warning(
                    "synchronous commit refused for %s; sent again with the next commit "
                    "(a partition leaving now is repeated by its next owner)",
                    ", ".join(_refusal(tp) for tp in refused),
                )

    def forget(self, partitions: Collection[PartitionKey]) -> None:
        """Drop all state of partitions this worker no longer owns."""
        self._settle_answers()
        keys = set(partitions)
        for pending in (job for queue in self._queues.values() for job in queue):
            for tp in keys.intersection(pending.offsets):
                del pending.offsets[tp]
                pending.counts.pop(tp, None)  # still running: counted until it is done
        for tp in keys:
            self._pending.pop(tp, None)
            self._pending_counts.pop(tp, None)
            self._committed.pop(tp, None)
            self._retry.pop(tp, None)
            self._confirmed.pop(tp, None)
        # their new owner consumes what this worker could not commit
        for entry in self._awaiting:
            entry.drop(keys)
        self._awaiting = deque(e for e in self._awaiting if e.offsets)
        for entry in self._rejected:
            self._records -= entry.drop(keys)
        self._rejected = [e for e in self._rejected if e.offsets]

    def committed(self) -> dict[PartitionKey, int]:
        self._settle_answers()
        return dict(self._committed)


def _offsets(partitions: list[TopicPartition]) -> dict[PartitionKey, int]:
    return {(tp.topic, tp.partition): tp.offset for tp in partitions}


def _refusal(tp: TopicPartition) -> str:
    error = tp.error.str() if isinstance(tp.error, KafkaError) else str(tp.error)
    return f"{tp.topic}[{tp.partition}]@{tp.offset}: {error}"
