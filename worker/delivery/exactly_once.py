"""Exactly-once delivery: each transaction holds its batches' results, dead letters and
consumed offsets.

Batches waiting behind each other share one transaction, for up to
``transaction_interval_ms``; while an open transaction closes (its batches finishing,
then ``send_offsets_to_transaction`` and ``commit_transaction``), new batches are held
for the next one, and count against the worker's bound. A retriable error is retried;
an abortable one aborts the transaction and rewinds every owned partition to its
committed offset, and work still in the stages is skipped (``stale``); a batch already
producing then goes on, outside any transaction (the producer refuses its records), and
no transaction begins until every batch from before the rewind is out of the stages, so
nothing of it ever commits beside its re-consumed copy. A record the broker refused for
itself is dead-lettered on the next try instead, and failures in a row that teach
nothing stop the worker (``TransactionTries``). A fenced or
fatal producer stops the worker, whose replacement owns the work. Partitions lost while
a transaction is open abort it too: nothing is ever committed for a partition this
worker no longer owns.
Every transactional call is made for the loop thread, which waits for it: librdkafka's
transaction API stalls when driven from a second thread while this one sits in
``consume``. The calls that reach the broker run through a ``CallWatch``, so one that
outlives its timeout (librdkafka can ignore it when the group coordinator goes away)
raises ``CallStalled`` instead of holding every partition for good.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from worker.config import KafkaSettings
from worker.core import Assignment, Deadline, DeliveryTracker, Job, PartitionKey
from worker.delivery.mode import Stages, commit_delivered
from worker.delivery.transaction_tries import TransactionTries
from worker.errors import ProducerUnusable, SinkError, SourceError
from worker.kafka import CallWatch

__all__ = ["GroupConsumer", "RewindGate", "Transactional"]

log = logging.getLogger(__name__)


class GroupConsumer(Protocol):
    """What a transaction and a rewind use of the consumer: ``worker.kafka.source.Source``,
    whose ``seek`` also drops a record of the partition it fetched before."""

    def consumer_group_metadata(self) -> object: ...

    def committed(
        self, partitions: list[TopicPartition], timeout: float
    ) -> list[TopicPartition]: ...

    def seek(self, partition: TopicPartition) -> None: ...


class RewindGate:
    """Exactly-once's gate (``BatchGate``): a batch enqueued before the latest rewind, or
    any batch while a rewind is under way, is stale and never produced. The rewind's
    thread is the loop thread; the processing threads only read."""

    def __init__(self) -> None:
        self._pending = threading.Event()
        self.rewinds = 0
        """Rewinds so far; a job enqueued before the latest one is never produced."""

    def begin(self) -> None:
        """A rewind starts: every batch in the stages is stale from now on."""
        self._pending.set()

    def rewound(self) -> None:
        """The partitions are being sought back: what was enqueued before is stale for good."""
        self.rewinds += 1

    def end(self) -> None:
        self._pending.clear()

    def stale(self, job: Job) -> bool:
        """A rewind is pending or came after the job was enqueued (a job still in a stage
        when the rewind came)."""
        return self._pending.is_set() or job.rewinds != self.rewinds

    def acknowledge(self) -> None:
        return None  # commit_transaction serves the reports, on the loop thread


class _Transaction:
    """The batches in the open transaction, and those held until it commits."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self.held: list[Job] = []
        self.closing = False
        self.started = 0.0

    def reset(self) -> None:
        self.jobs, self.held, self.closing, self.started = [], [], False, 0.0


class Transactional:
    """One Kafka transaction per group of batches; a failure rewinds, never skips."""

    def __init__(
        self,
        stages: Stages,
        consumer: GroupConsumer,
        settings: KafkaSettings,
        *,
        interval_s: float,
        timeout_s: float,
        owned: Assignment,
        drop_buffered: Callable[[], None],
        gate: RewindGate,
        calls: CallWatch | None = None,
    ) -> None:
        """``owned`` holds the partitions to rewind; ``drop_buffered`` empties the batchers
        (their records are consumed again after the seek); ``gate`` tells the processing
        threads which batches a rewind made stale; ``calls`` runs the calls that reach the
        broker (a ``CallWatch`` of its own by default)."""
        self._calls = calls or CallWatch()
        self._stages = stages
        self._sink = stages.sink
        self._threads = stages.threads
        self.committer = stages.committer
        self._consumer = consumer
        self._settings = settings
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._owned = owned
        self._drop_buffered = drop_buffered
        self._txn = _Transaction()
        self._gate = gate
        self._unusable: SinkError | None = None
        """Why the producer cannot begin a transaction: the worker stops."""
        self._tries = TransactionTries({n: p.refusal_of for n, p in stages.pipelines.items()})

    def tracker(self, pipeline: str, oldest_ts_ms: int) -> DeliveryTracker:
        """A refused record aborts the transaction; the batches made after that send its
        dead letter instead."""
        return DeliveryTracker(
            pipeline, oldest_ts_ms, keep_refused=True, refusals=self._tries.refusals(pipeline)
        )

    def enqueue(self, job: Job) -> None:
        txn = self._txn
        job.rewinds = self._gate.rewinds
        if txn.closing or (not txn.jobs and (txn.held or self._abandoned_running())):
            txn.held.append(job)  # it joins the next transaction
            return
        if not txn.jobs:
            self._begin()
        txn.jobs.append(job)
        self.committer.track(job)
        self._threads.submit(job)
        self._stages.metrics.in_flight_batches.set(len(self.committer))

    def records_in_flight(self) -> int:
        """The committer's count and the batches held for the next transaction, which
        are consumed but in no transaction yet."""
        return self.committer.records + sum(len(job.batch) for job in self._txn.held)

    def records_of(self, pipeline: str) -> int:
        held = sum(len(job.batch) for job in self._txn.held if job.pipeline == pipeline)
        return self.committer.records_of(pipeline) + held

    def serve(self, timeout: float) -> None:
        if timeout:
            time.sleep(timeout)  # commit_transaction serves the delivery reports

    def commit(self, *, asynchronous: bool = True) -> None:
        if self._unusable is not None:
            raise self._unusable  # a revoke, which logs and goes on, may have caught it
        self._advance()
        commit_delivered(self._stages, asynchronous=asynchronous, count=False)

    def settled(self) -> bool:
        return True  # a batch's offsets commit with its transaction, or not at all

    def finish(self, deadline: Deadline, *, at_least_s: float) -> None:
        self._advance(deadline=deadline)
        self._advance(deadline=deadline)  # the batches held while it closed

    def revoked(self, partitions: set[PartitionKey]) -> None:
        """After ``finish`` nothing of the revoked partitions is left open; if it could not
        finish, what is left must not commit later without its offsets: abandon it."""
        if self._touches(partitions):
            self._abandon(f"revoked {sorted(partitions)} before their transaction closed")
        self.committer.forget(partitions)
        self._tries.forget(partitions)

    def lost(self, partitions: set[PartitionKey]) -> None:
        """Their next owner serves their records again, so the open transaction, which
        may hold results of them, is aborted and the partitions still owned rewound."""
        if self._touches(partitions):
            self._abandon(f"lost {sorted(partitions)} while their transaction was open")
        self.committer.forget(partitions)
        self._tries.forget(partitions)

    def close(self, timeout: float) -> None:
        return None

    # -- the transaction ---------------------------------------------------------------

    def _advance(self, *, deadline: Deadline | None = None) -> None:
        """Commit the open transaction once its batches are all produced and nothing else
        is waiting, or after ``interval_s`` (new batches are then held for the next one).
        With ``deadline``, close it now, waiting for its batches until then."""
        txn = self._txn
        if not txn.jobs:
            self._begin_held(deadline)
            if not txn.jobs:
                return
        force = deadline is not None
        if (
            not force
            and self._threads.pending()
            and time.monotonic() - txn.started < (self._interval_s)
        ):
            return
        txn.closing = True
        if not all(job.tracker.sealed for job in txn.jobs):
            if deadline is None:
                return
            if not deadline.wait(lambda: all(job.tracker.sealed for job in txn.jobs), self._look):
                self._threads.check()
                raise SinkError("batches of the open transaction did not finish in time")
        producer = self._sink.producer
        offsets: dict[PartitionKey, int] = {}
        for job in txn.jobs:
            offsets.update(job.offsets)
        try:
            failed = next((job.tracker.errors[0] for job in txn.jobs if job.tracker.errors), "")
            if failed:
                raise KafkaException(_abortable(f"a delivery failed: {failed}"))
            parts = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
            metadata = self._consumer.consumer_group_metadata()
            _retrying(
                lambda: self._calls.run(
                    "send_offsets_to_transaction",
                    lambda t: producer.send_offsets_to_transaction(parts, metadata, t),
                    self._calls.coordinator_timeout_s,
                )
            )
            _retrying(lambda: self._calls.run("commit_transaction", producer.commit_transaction))
            self._stages.metrics.commits.inc()
            self._tries.committed(offsets)
            log.debug(
                "committed a transaction of %d batches in %.3fs",
                len(txn.jobs),
                time.monotonic() - txn.started,
            )
        except KafkaException as exc:
            self._fail(exc)
            return
        held = txn.held
        txn.reset()
        for job in held:
            self.enqueue(job)

    def _begin(self) -> None:
        """Begin the next transaction; a producer that cannot (fenced, fatal) is beyond
        use: SinkError, now and at every later ``commit``."""
        try:
            self._sink.producer.begin_transaction()
        except KafkaException as exc:
            self._unusable = ProducerUnusable(
                f"begin_transaction failed ({exc}); stopping without a commit, the group "
                "hands the partitions on"
            )
            raise self._unusable from exc
        self._txn.started = time.monotonic()

    def _abandoned_running(self) -> bool:
        """Whether a batch from before the latest rewind is still in a stage: one that was
        producing then may still be, and must not reach a transaction begun now."""
        rewinds = self._gate.rewinds
        return any(job.rewinds != rewinds for job in self._threads.unfinished())

    def _begin_held(self, deadline: Deadline | None) -> None:
        """Begin the next transaction with the batches held behind abandoned ones, once
        those are out of the stages (with ``deadline``: waiting for them until then)."""
        if not self._txn.held:
            return
        if self._abandoned_running():
            self._threads.check()
            if deadline is None or not deadline.wait(
                lambda: not self._abandoned_running(), self._look
            ):
                return
        held, self._txn.held = self._txn.held, []
        for job in held:
            self.enqueue(job)

    def _look(self) -> None:
        """Between two looks at the stages: raise what stopped them, else wait a little."""
        self._threads.check()
        time.sleep(0.005)

    def _touches(self, partitions: set[PartitionKey]) -> bool:
        txn = self._txn
        return any(partitions.intersection(job.offsets) for job in (*txn.jobs, *txn.held))

    def _fail(self, exc: KafkaException) -> None:
        """Abortable: abort and rewind, then keep what the broker refused for the next try
        (``TransactionTries``), which stops the worker once the same work failed too often
        in a row. Anything else (fenced: another producer with this transactional id took
        over; or fatal) stops the worker: re-creating the producer would fence the
        replacement that now owns the work."""
        err = exc.args[0] if exc.args else None
        if not isinstance(err, KafkaError) or err.fatal() or not err.txn_requires_abort():
            raise ProducerUnusable(
                f"the transactional producer cannot go on ({exc}); stopping without a "
                "commit, the group hands the partitions on"
            ) from exc
        jobs = list(self._txn.jobs)
        self._abandon(f"transaction failed: {exc}")
        self._tries.failed(jobs, str(exc))  # after the abort's flush served their reports

    def _abandon(self, why: str) -> None:
        """Abort the open transaction and rewind the owned partitions to their committed
        offsets. Raises SinkError when the producer cannot abort."""
        txn = self._txn
        log.warning("%s: aborting %d batches and rewinding", why, len(txn.jobs))
        self._gate.begin()
        if txn.jobs:
            try:
                # What is still queued goes out first: a transaction whose records have not
                # reached the broker yet cannot be ended there (INVALID_TXN_STATE).
                producer = self._sink.producer
                producer.flush(self._timeout_s)
                self._calls.run("abort_transaction", producer.abort_transaction)
            except KafkaException as exc:
                raise ProducerUnusable(f"cannot abort the transaction ({exc}); stopping") from exc
        for job in txn.jobs:
            job.tracker.fail(why)
        txn.reset()
        self._rewind_to_committed()

    def _rewind_to_committed(self) -> None:
        """Drop all work in flight and restart from the committed offsets. A batch still
        running in a stage is not waited for: ``enqueue`` holds the next transaction."""
        self._gate.rewound()
        dropped = len(self._threads.discard_queued())
        self._drop_buffered()
        self.committer.clear()
        owned = self._owned.partitions
        self._seek_to_committed(owned)
        self._txn.reset()
        self._gate.end()
        log.warning(
            "rewound %d partitions to their committed offsets (%d queued batches dropped)",
            len(owned),
            dropped,
        )

    def _seek_to_committed(self, partitions: set[PartitionKey]) -> None:
        """Seek each of ``partitions`` to its committed offset. Raises SourceError when
        one cannot be read or sought: the worker stops, and whoever owns the partitions
        next starts from their committed offsets."""
        if not partitions:
            return
        consumer = self._consumer
        tps = [TopicPartition(t, p) for t, p in sorted(partitions)]
        reset = OFFSET_BEGINNING if self._settings.auto_offset_reset == "earliest" else OFFSET_END
        try:
            committed = consumer.committed(tps, timeout=30)
        except KafkaException as exc:
            raise _cannot_rewind("committed()", exc) from exc
        for tp in committed:
            if tp.error is not None:  # its offset is unknown, not absent: reset would skip
                raise _cannot_rewind(f"committed() of {tp.topic}[{tp.partition}]", tp.error)
            offset = tp.offset if tp.offset >= 0 else reset
            try:
                consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
            except KafkaException as exc:
                raise _cannot_rewind(f"seek of {tp.topic}[{tp.partition}]", exc) from exc


def _cannot_rewind(call: str, why: object) -> SourceError:
    return SourceError(f"rewind: {call} failed ({why}); stopping without a commit")


def _retrying(call: Callable[[], object], attempts: int = 5) -> None:
    """Run a transactional call again while it fails with a retriable error."""
    for attempt in range(attempts):
        try:
            call()
            return
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.retriable() and attempt < attempts - 1:
                continue
            raise


def _abortable(why: str) -> KafkaError:
    return KafkaError(KafkaError._INVALID_ARG, why, txn_requires_abort=True)
