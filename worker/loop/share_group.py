"""A share group behind the loop's ``Group`` seam: one member of a KIP-932 share group.

A consumer group never uses more workers than its topics have partitions; a share group
hands the records of one partition to every member, each acquired for the group's
record lock and acknowledged one by one. The one loop (``Worker``) runs the same
pipelines, processing threads, sink and delivery tracking for both; ``ShareGroup``
acquires records with a ``ShareSource`` poll and settles them by acknowledging, instead
of offsets, a committer and rebalances. It is at-least-once: a record is
ACCEPTed only once its result or dead letter is acknowledged by the broker; one not
delivered is RELEASEd (the broker delivers it again, to any member); results are not in
partition order.

One poll at a time: in explicit acknowledgement mode every record of a poll must be
acknowledged before the next, so a poll (``max.poll.records``, the in-flight bound) is
what the worker holds, and there is nothing to pause. The loop thread takes a poll
through these steps (``acquire``: 1 to 3, ``settle``: 4 and 5):

1. A record on the group's last allowed delivery (``share.delivery.count.limit``)
   becomes a ``redelivered`` dead letter before anything runs it, and is never
   released (``worker.loop.share_last``).
2. What the worker could not finish within ``LOCK_SHARE`` of the record lock, at the
   rate it finished earlier polls (``LockBudget``), is released at once, for others.
3. The rest is split into batches (``worker.loop.share_poll.split``), each a ``Job``
   for the processing threads, whose stages overlap as in ``Worker``. A record
   delivered nearly as often as the group allows (``isolated_from``) is served alone
   after them, each acknowledged to the broker before the next starts, so that a record
   that kills its members reaches its last delivery without its batch-mates
   (``worker.loop.share_poll`` says how); where they would not all fit in the lock
   budget one by one, they are served in as few groups as fit (``group_size``), never
   released.
4. The loop serves delivery reports (and dead-letters records the broker refuses for
   themselves, through ``RefusedRecords``) and ACCEPTs each job whose deliveries all
   succeeded, sending the acknowledgements at once. A failed delivery raises
   ``SinkError``: the worker stops, releasing what was not delivered.
5. At ``LOCK_SHARE`` of the lock, the batches no stage has started are released (their
   records stay below ``isolated_from``, so a release never brings a record to its last
   delivery); those running go on while the lock lasts. A batch the processing threads
   reach after the lock ran out (``LockGate``) is neither run nor produced, but
   released and counted as a lock overrun: the broker may have handed its records to
   another member meanwhile, at the group's last delivery as a dead letter, and a
   result here too would give a request two outcomes.

Threads are the loop's: the loop thread owns the share consumer (its callbacks run
inside its poll and commits, ``ShareEvents``), the three processing threads run the
batches, delivery reports run wherever the producer is polled. ``Worker.stop()`` (a
signal) lets the poll in flight finish for up to ``shutdown_timeout_s``; what is then
left is released before the worker leaves the group.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka import Message

from worker.config import WorkerConfig
from worker.core import Clock, Deadline, Job, monotonic_clock
from worker.delivery import RefusedRecords
from worker.errors import SinkError
from worker.kafka import ShareGroupSettings, ShareSource, Sink, position
from worker.loop.group import Turn
from worker.loop.metrics import ShareMetrics
from worker.loop.share_events import ShareEvents
from worker.loop.share_last import LastDeliveries, UnservedLetters
from worker.loop.share_poll import (
    LockBudget,
    LockGate,
    PollInFlight,
    group_size,
    keep_within,
    serving_order,
    split,
)
from worker.loop.threads import StageThreads

__all__ = ["ShareGroup", "ShareParts"]

log = logging.getLogger(__name__)

_SERVE_S = 0.005
"""How long one turn of waiting for a poll's jobs waits for delivery reports."""
_QUIET_S = 60.0
"""A repeated warning (released surplus, lock overruns) is logged at most this often."""


@dataclass(frozen=True, slots=True)
class ShareParts:
    """What a share group drives, built by ``worker.compose.wire_worker``."""

    source: ShareSource
    sink: Sink
    threads: StageThreads
    refused: RefusedRecords
    pipelines: Mapping[str, UnservedLetters]
    events: ShareEvents
    group: ShareGroupSettings
    metrics: Mapping[str, ShareMetrics]
    """Each pipeline's share-group metrics, by pipeline name."""
    gate: LockGate
    """The processing threads' gate: what it finds past the record lock is not run."""


class _Quiet:
    """Warnings that repeat (released surplus, overruns) logged at most every ``_QUIET_S``."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._at: dict[str, float] = {}

    def __call__(self, key: str, message: str, *args: object) -> None:
        now = self._clock()
        if now - self._at.get(key, -_QUIET_S) >= _QUIET_S:
            self._at[key] = now
            log.warning(message, *args)


class ShareGroup:
    """One member of a share group, as the loop's ``Group``. Loop thread only."""

    def __init__(
        self,
        *,
        config: WorkerConfig,
        parts: ShareParts,
        clock: Clock = monotonic_clock,
    ) -> None:
        self.config = config
        self._source = parts.source
        self._sink = parts.sink
        self._threads = parts.threads
        self._refused = parts.refused
        self._events = parts.events
        self._metrics = parts.metrics
        self._gate = parts.gate
        self._limit = parts.group.delivery_count_limit
        self._lock_s = parts.group.record_lock_s
        self._route = {t: p.name for p in config.pipelines for t in p.request_topics}
        self._max_size = {p.name: p.batch.max_batch_size for p in config.pipelines}
        self._budget = LockBudget(self._lock_s, clock)
        self._clock = clock
        self._poll_s = config.poll_timeout_ms / 1000.0
        self._inflight: PollInFlight | None = None
        self._acquired: tuple[PollInFlight, list[Job]] | None = None
        """The poll this turn acquired and its batches handed to the stages, to settle."""
        self._alone: list[Message] = []
        """Records of the poll in flight to serve alone, not handed to the stages yet."""
        self._warn = _Quiet(clock)
        self._last = LastDeliveries(
            limit=self._limit,
            route=self._route,
            pipelines=parts.pipelines,
            sink=parts.sink,
            tracker=parts.refused.tracker,
            metrics=parts.metrics,
            clock=clock,
            warn=self._warn,
        )
        """The poll's last-delivery dead letters."""
        self._sync_acks = False
        """The poll in flight has records to serve alone: its acceptances go out only by
        ``_acknowledged``'s synchronous commit, so that each single starts only once the
        broker has every acceptance made before it (an asynchronous send would leave the
        synchronous commit nothing to wait for)."""
        self._stopping: Deadline | None = None
        """From the first look at a stop request: how long the poll in flight may take."""
        self._active_at = clock()
        """When records last came: burst mode stops after a long enough quiet."""

    def join(self) -> None:
        """Subscribe; a share group has no rebalance listener."""
        self._source.subscribe()

    def raise_fatal(self) -> None:
        self._events.raise_fatal()

    def records_of(self, pipeline: str) -> int:
        """Records of ``pipeline`` this member holds (acquired, not acknowledged)."""
        poll = self._inflight
        if poll is None:
            return 0
        waiting = sum(1 for m in self._alone if self._route[position(m)[0]] == pipeline)
        return poll.records_of(pipeline) + waiting

    # -- acquire -------------------------------------------------------------------------

    def acquire(self) -> None:
        """A poll: its last deliveries dead-lettered, what the lock budget leaves no room
        for released, the rest cut into batches and handed to the stages (those to serve
        alone wait for ``settle``)."""
        records = self._source.poll(self._poll_s)
        if not records:
            return
        self._events.joined()
        self._active_at = polled_at = self._clock()
        jobs = self._last.dead_letter(records)
        batched, alone = serving_order(records, self._limit)
        kept, surplus = keep_within(batched, self._budget.room(max(self._max_size.values())))
        if surplus:
            self._give_back_surplus(surplus)
        route, tracker = self._route, self._refused.tracker
        served = [Job.close(name, b, tracker) for name, b in split(kept, route, self._max_size)]
        poll = self._inflight = PollInFlight(jobs + served, polled_at, self._lock_s)
        self._gate.hold(poll)
        self._acquired = poll, served
        self._alone = list(alone)
        self._sync_acks = bool(alone)
        for job in served:
            self._threads.submit(job)

    # -- settle --------------------------------------------------------------------------

    def settle(self, turn: Turn) -> None:
        """Serve the poll just acquired until each record is acknowledged: its batches,
        then those served alone, then the last deliveries' dead letters. Without one,
        serve the dead letters of refused records."""
        acquired, self._acquired = self._acquired, None
        if acquired is None:
            self._refused.serve(0)
            return
        poll, served = acquired
        finished = self._wait(turn, poll, served)
        if finished and served:
            self._budget.observe(poll.accepted_of(served), poll.polled_at)
        alone = self._sync_acks
        while finished and self._alone:
            started = self._clock()
            self._acknowledged()
            job = self._next_alone(poll)
            self._threads.submit(job)
            finished = self._wait(turn, poll, [job], release=False)
            self._budget.observe_turn(started)
        if finished:  # the last deliveries' dead letters
            finished = self._wait(turn, poll, poll.held(), release=False)
        if alone and finished:
            self._acknowledged()
        if not poll.open and not self._alone:
            self._inflight = None
            self._last.clear()

    def drain(self) -> None:
        """Nothing to drain: a poll is settled (or its shutdown timeout passed) in the
        turn that acquired it."""

    def failed(self, exc: BaseException) -> None:
        """Nothing to hold back: what was not accepted is released on the way out."""

    def _next_alone(self, poll: PollInFlight) -> Job:
        """The next turn of serving alone: one record while the rest fit in the lock
        budget, else as many (of one pipeline) as leave each later turn its time."""
        left = poll.polled_at + self._budget.seconds - self._clock()
        name = self._route[position(self._alone[0])[0]]
        size = min(self._max_size[name], group_size(len(self._alone), left, self._budget.turn_s))
        group = []
        for msg in self._alone[:size]:
            if self._route[position(msg)[0]] != name:
                break
            group.append(msg)
        del self._alone[: len(group)]
        job = Job.close(name, group, self._refused.tracker)
        poll.add(job)
        return job

    def _acknowledged(self) -> None:
        """Wait until the broker has every acknowledgement made so far: a record served
        alone (a suspected killer) must not cost those before it another delivery."""
        refused = self._source.commit(min(5.0, self._lock_s))
        if refused:
            log.warning("the broker refused acknowledgements: %s", refused)

    def _wait(
        self, turn: Turn, poll: PollInFlight, jobs: Sequence[Job], *, release: bool = True
    ) -> bool:
        """Serve ``poll`` until each of ``jobs`` is acknowledged, releasing at the lock
        budget what has not started (unless ``release`` is False: records served alone
        are never released); after ``stop()``, for up to the shutdown timeout. False: the
        shutdown timeout passed first."""
        lock_deadline = poll.polled_at + self._budget.seconds
        while poll.holds(jobs):
            turn.check()
            self._refused.serve(_SERVE_S)
            self._settle(poll)
            self._last.resend(poll)
            if release and not poll.over_budget and self._clock() >= lock_deadline:
                poll.over_budget = True
                self._release_unstarted(poll)
            if turn.stopping:
                if self._stopping is None:
                    self._stopping = Deadline.after(self.config.shutdown_timeout_s, self._clock)
                elif self._stopping.passed():
                    log.warning(
                        "stopping with %d batches of a poll unfinished after %.0fs; they are "
                        "released and delivered again",
                        len(poll.held()),
                        self.config.shutdown_timeout_s,
                    )
                    return False
        return True

    def _settle(self, poll: PollInFlight) -> None:
        """ACCEPT every job whose deliveries are done, and send the acknowledgements.
        Raises SinkError for a job whose delivery failed (it stays held, to release)."""
        settled = poll.settle()
        if settled.accepted:
            late = self._clock() > poll.lock_expires
            for job in settled.accepted:
                metrics = self._metrics[job.pipeline]
                metrics.accepted.inc(self._source.accept(job.batch))
                if late:
                    metrics.lock_overruns.inc(len(job.batch))
            if not self._sync_acks:  # with singles to serve, _acknowledged sends them
                self._source.send()
            if late:
                self._warn(
                    "overrun",
                    "records finished after their %gs record lock expired: the broker may "
                    "have delivered them to another member too (lower max_in_flight_batches "
                    "or max_batch_size, or raise the group's share.record.lock.duration.ms)",
                    self._lock_s,
                )
        for job in settled.failed:
            if self._last.failed(job):
                continue
            if self._gate.stale(job):
                self._expired(poll, job)
            else:
                errors = job.tracker.errors
                raise SinkError(
                    f"{len(errors)} deliveries of a batch failed, not acknowledging it: "
                    + "; ".join(errors)
                )

    def _expired(self, poll: PollInFlight, job: Job) -> None:
        """A batch the gate held back, its lock run out: its records are the broker's
        again (it refuses this release, or counts it as the lock would)."""
        for held in poll.release([job]):
            self._metrics[held.pipeline].released.inc(self._source.release(held.batch))
            self._metrics[held.pipeline].lock_overruns.inc(len(held.batch))
        self._source.send()
        self._warn(
            "expired",
            "the %gs record lock ran out before a batch of %d records was produced: not "
            "produced here, the broker delivers it again (lower max_in_flight_batches or "
            "max_batch_size, or raise the group's share.record.lock.duration.ms)",
            self._lock_s,
            len(job.batch),
        )

    def _release_unstarted(self, poll: PollInFlight) -> None:
        """The poll outlived the lock budget: release the jobs no stage has started."""
        jobs = poll.release(self._threads.discard_queued())
        for job in jobs:
            self._metrics[job.pipeline].released.inc(self._source.release(job.batch))
        if jobs:
            self._source.send()
        self._warn(
            "lock",
            "a poll of %d records is not finished after %.0fs of its %gs record lock: "
            "released the %d batched records no stage had started, for other members (lower "
            "max_in_flight_batches or max_batch_size, or raise the group's "
            "share.record.lock.duration.ms)",
            poll.records,
            self._budget.seconds,
            self._lock_s,
            sum(len(job.batch) for job in jobs),
        )

    def _give_back_surplus(self, surplus: list[Message]) -> None:
        """Release at once what this poll brought beyond the lock budget."""
        route, metrics = self._route, self._metrics
        for msg in surplus:
            metrics[route[position(msg)[0]]].released.inc(self._source.release([msg]))
        self._source.send()
        self._warn(
            "surplus",
            "a poll brought %d records more than this worker finishes within %.0fs of the "
            "record lock; released them at once, for other members",
            len(surplus),
            self._budget.seconds,
        )

    def idle_for(self, seconds: float) -> bool:
        """Burst mode: a member, holds nothing, and nothing came for ``seconds``."""
        return (
            self._events.member
            and self._inflight is None
            and self._clock() - self._active_at >= seconds
        )

    # -- shutdown ------------------------------------------------------------------------

    def give_back(self) -> None:
        """Release the poll's queued jobs (nothing of them was produced) and the records
        still to serve alone."""
        poll = self._inflight
        if poll is None:
            return
        for job in poll.release(self._threads.discard_queued()):
            self._metrics[job.pipeline].released.inc(self._source.release(job.batch))
        for msg in self._alone:
            self._metrics[self._route[position(msg)[0]]].released.inc(self._source.release([msg]))
        self._alone = []

    def leave(self) -> None:
        """After the processing threads: accept what was delivered, release the rest,
        send the acknowledgements and leave the group."""
        poll = self._inflight
        timeout = min(5.0, self.config.shutdown_timeout_s)
        if poll is not None and poll.open:
            try:
                self._refused.finish(Deadline.after(timeout, self._clock), at_least_s=0.1)
                for job in poll.settle().accepted:
                    self._metrics[job.pipeline].accepted.inc(self._source.accept(job.batch))
            except Exception:  # the records stay unaccepted: released below
                log.exception("finishing the last deliveries failed")
            self._give_up(poll)
        self._inflight = None
        self._last.clear()
        try:
            refused = self._source.commit(timeout)
            if refused:
                log.warning("the broker refused the last acknowledgements: %s", refused)
            self._source.close()
        except Exception:  # close must not hide the error that brought us here
            log.exception("closing the share consumer failed")
        self._sink.flush(timeout)

    def _give_up(self, poll: PollInFlight) -> None:
        """Release what the stopping worker holds; a last delivery whose dead letter is
        still undelivered is archived by the broker whatever is done now: say which."""
        self._last.lost(poll.held())
        for job in poll.release(poll.held()):
            if job not in self._last:
                self._metrics[job.pipeline].released.inc(self._source.release(job.batch))
