"""A consumer group behind the loop's ``Group`` seam: records consumed from the assigned
partitions, outcomes settled by committing offsets through the delivery mode.

Records are routed to each pipeline's batcher; a batch is handed to the processing
threads when it closes. Delivery reports are served and the delivered prefix of
batches committed (coalesced, at most once every ``commit_interval_ms``). While
``max_in_flight_batches`` full batches' worth of records are unfinished the group holds
back (waiting, then pausing its partitions) but keeps calling ``consume``, so slow
models or an unreachable Redis never make it miss ``max.poll.interval.ms``.

Pipelines of different ``priority`` share the processing threads by lane
(``worker.loop.lanes``). A pipeline with a share of the in-flight bound (a lower
priority's ``bulk_in_flight_share``, or its own ``max_in_flight_share``) has only its
partitions paused at that share, so a bulk backlog never fills the bound that a
latency-sensitive pipeline needs room in.

Rebalances run inside ``consume`` on the loop thread (``worker.loop.membership``). After
``stop()`` the group drains open batches, commits and leaves.

With ``delivery = "exactly-once"`` (``worker.delivery.exactly_once``) a transaction holds the
results, dead letters and offsets of batches waiting behind each other (for up to
``transaction_interval_ms``); an abortable error aborts it and rewinds every owned
partition to its committed offset. Any other producer error (fenced, fatal, a refused
``begin_transaction``) raises ``ProducerUnusable``: the worker stops without committing,
closes its consumer (leaving the group) and ``streamfer run`` starts again in place
(``worker.ops.recovery``); the producer is never re-created or re-initialised within one
process image. The partitions' next owners begin at their committed offsets (a new
producer with the same transactional id, under static membership, fences the old one).
A transactional call that outlives its timeout (``CallStalled``) stops it too, but the
clients are left unclosed, since closing them would wait on the same stuck broker, and
``streamfer run`` starts itself again in place (``worker.ops.recovery``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka import Message

from worker.config import WorkerConfig
from worker.core import Clock, Deadline, Job, PartitionKey, monotonic_clock, wall_clock
from worker.delivery import Committer, Delivery, commit_before_leaving
from worker.errors import CallStalled, SinkError, StreamferError
from worker.kafka import Source, position
from worker.loop.batcher import Batcher
from worker.loop.consumer_events import ConsumerEvents
from worker.loop.group import Turn
from worker.loop.membership import Membership
from worker.loop.pausing import PausingManager
from worker.loop.threads import StageThreads

__all__ = ["ConsumerGroup", "ConsumerParts"]

log = logging.getLogger(__name__)

_IDLE_CHECK_S = 0.001
"""Adaptive batching: how often the loop looks for an idle model while records wait. The
loop waits inside the consumer's fetch, which nothing wakes when the stages finish, so
this is how late a waiting record may reach the idle model: at 5 ms it was most of the
latency setting's p99 (8-10 ms against a median of 2-3). 1 ms is librdkafka's finest
wait, and the loop wakes that often only while the model is busy and records wait."""


@dataclass(frozen=True, slots=True)
class ConsumerParts:
    """What a consumer group drives, each part built once, after the parts it needs, by
    the composition root (``worker.compose.wire_worker``)."""

    source: Source
    batchers: Mapping[str, Batcher[Message]]
    """Each pipeline's open batch, by pipeline name."""
    committer: Committer
    threads: StageThreads
    pausing: PausingManager
    membership: Membership
    delivery: Delivery
    events: ConsumerEvents
    shared: Sequence[str]
    """Pipelines with a share of the bound: their records are counted each turn."""


class ConsumerGroup:
    """One member of a consumer group, as the loop's ``Group``. Loop thread only."""

    def __init__(
        self,
        *,
        config: WorkerConfig,
        parts: ConsumerParts,
        abort: threading.Event,
        clock: Clock = monotonic_clock,
        wall: Clock = wall_clock,
    ) -> None:
        """``abort`` is the loop's: set when draining gives up, so a batch waiting for
        the feature store gives up at once."""
        self.config = config
        self._abort = abort
        self._source = parts.source
        self._batchers = parts.batchers
        self._committer = parts.committer
        self._threads = parts.threads
        self._pausing = parts.pausing
        self._membership = parts.membership
        self._delivery = parts.delivery
        self._events = parts.events
        self._owned = parts.events.owned
        self._lag = parts.events.lag
        self._shared = list(parts.shared)
        pipelines = config.pipelines
        self._route = {t: p.name for p in pipelines for t in p.request_topics}
        self._rank = {p.name: p.rank for p in pipelines}
        self._clock = clock
        self._wall = wall
        self._wedged = False  # a client call outlived its timeout: leave the clients unclosed
        self._single = next(iter(self._batchers)) if len(self._batchers) == 1 else None
        self._max_messages = max(p.batch.max_batch_size for p in pipelines)
        self._poll_s = config.poll_timeout_ms / 1000.0
        self._adaptive = all(b.adaptive for b in self._batchers.values())
        self._fetch_started = clock()
        self._active_at = clock()
        """When records last came: burst mode stops after a long enough quiet."""

    @property
    def assigned(self) -> set[PartitionKey]:
        return self._owned.partitions

    def join(self) -> None:
        """Subscribe with ``Membership`` as the rebalance listener."""
        self._source.subscribe(self._membership)

    def raise_fatal(self) -> None:
        self._events.raise_fatal()

    def records_of(self, pipeline: str) -> int:
        """Records of ``pipeline`` consumed and not committed."""
        return self._committer.records_of(pipeline)

    # -- acquire -------------------------------------------------------------------------

    def acquire(self) -> None:
        """Check the retention of newly assigned partitions; consume within the earliest
        batch window; route records to their batcher; hand over the batches that close."""
        unchecked = self._membership.take_unchecked()
        if unchecked:
            self._source.check_retention(unchecked)
        self._batch(self._fetch())
        self._close_windows()

    def _fetch(self) -> list[Message]:
        """Records fetched within the earliest batch window: an open batch's deadline, or
        an empty one's whole window (``consume`` waits for a full batch or its timeout)."""
        self._fetch_started = now = self._clock()
        timeout = self._poll_s
        batchers = self._batchers.values()
        for batcher in batchers:
            deadline = batcher.deadline()
            if deadline is None:
                timeout = min(timeout, batcher.max_wait_s)
            else:
                timeout = min(timeout, max(0.0, deadline - now))
        most = self._max_messages
        if self._shared:
            most = self._pausing.fetch_limit(most, self._share_counts())
        if self._adaptive:
            # Take records as soon as they are there (a lone request is not held for a
            # full fetch), and while records wait for a busy model, look again every few
            # milliseconds so they go the moment it is idle.
            if self._threads.pending() and any(map(len, batchers)):
                timeout = min(timeout, _IDLE_CHECK_S)
            messages = self._source.consume_first(most, timeout)
        else:
            messages = self._source.consume(most, timeout)
        if messages:
            self._active_at = self._clock()
            self._lag.consumed(len(messages))
        return messages

    def _batch(self, messages: list[Message]) -> None:
        """Route records to their pipeline's batcher; hand over every batch that closes."""
        if not messages:
            return
        single = self._single
        groups = (
            {single: messages} if single is not None else _group_by_pipeline(messages, self._route)
        )
        for name, items in groups.items():
            ts = items[0].timestamp()[1]
            age = max(0.0, self._wall() - ts / 1000.0) if ts > 0 else 0.0
            for batch in self._batchers[name].add(items, self._fetch_started, age):
                self._submit(name, batch)

    def _close_windows(self) -> None:
        """Hand over batches whose window ended; adaptive: an idle model takes whatever is
        waiting, however few. Idle is per lane: nothing of this pipeline's priority or a
        higher one is in the stages (a lower lane's batch would be overtaken anyway)."""
        threads, rank = self._threads, self._rank
        for name, batcher in self._batchers.items():
            if batcher.adaptive and len(batcher) and not threads.pending(rank[name]):
                ready = batcher.flush()
            else:
                ready = batcher.expired()
            if ready is not None:
                self._submit(name, ready)

    def _submit(self, name: str, batch: list[Message]) -> None:
        self._delivery.enqueue(Job.close(name, batch, self._delivery.tracker))

    # -- settle --------------------------------------------------------------------------

    def settle(self, turn: Turn) -> None:
        """Serve delivery reports, commit what is ready, hold back at the bound."""
        self._delivery.serve(0)
        self._delivery.commit()
        self._apply_backpressure()

    def idle_for(self, seconds: float) -> bool:
        """Burst mode: owns partitions, holds nothing, and nothing came for ``seconds``."""
        return (
            bool(self.assigned)
            and not len(self._committer)
            and all(len(b) == 0 for b in self._batchers.values())
            and self._clock() - max(self._active_at, self._owned.since) >= seconds
        )

    def _apply_backpressure(self) -> None:
        """Bound the records in flight to ``max_in_flight_batches`` full batches' worth:
        the committer's ``records``, what is really unfinished (not yet delivered, or a
        commit refused or stalled), never delivered records waiting for the next commit.

        Counting records rather than batches lets many small batches (light load, short
        windows) wait for their acknowledgements without stalling the loop, while a crash
        still replays at most that many records. At the bound the loop first just waits
        for the processing threads (serving deliveries and commits) for up to a quarter of
        ``max.poll.interval.ms``, at most one second; only a batch slower than that makes
        ``PausingManager`` pause every owned partition while the loop goes back to
        polling, so the group never sees a stalled member. Pausing is the last resort
        because librdkafka needs most of a second to deliver again after a resume
        (measured here), which would throttle an ordinary backlog.

        A pipeline's share is different: no waiting (the other pipelines must keep
        flowing), only its partitions pause. Their resume costs tens of milliseconds
        while another pipeline's partitions are being fetched (up to the consumer's
        ``fetch.wait.max.ms`` when those are quiet), which the batch it resumes at covers.

        A pipeline waiting for its model (``StageThreads.parked``) has its partitions
        paused, and its records are left out of the bound while it waits, so that the
        other pipelines keep flowing.
        """
        delivery, pausing, threads = self._delivery, self._pausing, self._threads
        waiting = threads.parked()

        def counted() -> int:
            records = delivery.records_in_flight()
            return records - sum(map(delivery.records_of, waiting)) if waiting else records

        if pausing.full(counted()) and not pausing.bound_reached:

            def serve() -> None:
                threads.check()
                delivery.serve(0.002)
                delivery.commit()

            grace = min(1.0, self.config.kafka.max_poll_interval_ms / 4000.0)
            Deadline.after(grace, self._clock).wait(lambda: not pausing.full(counted()), serve)
        pausing.update(
            counted(),
            self.assigned,
            len(self._committer),
            self._share_counts() if self._shared else None,
            waiting,
        )

    def _share_counts(self) -> dict[str, int]:
        """Records consumed and not committed (in flight, held for a transaction, or in
        the open batch) of each pipeline with a share of the bound."""
        delivery, batchers = self._delivery, self._batchers
        return {name: delivery.records_of(name) + len(batchers[name]) for name in self._shared}

    # -- shutdown ------------------------------------------------------------------------

    def drain(self) -> None:
        """Hand over the open batches, wait for the threads, commit and serve a last
        rebalance; raise ``SinkError`` where batches stay unfinished."""
        for name, batcher in self._batchers.items():
            rest = batcher.flush()
            if rest:
                self._submit(name, rest)
        deadline = Deadline.after(self.config.shutdown_timeout_s)
        delivery, threads = self._delivery, self._threads

        def serve() -> None:
            threads.check()
            delivery.serve(0.01)
            delivery.commit()

        deadline.wait(lambda: not threads.pending(), serve)
        self._threads.check()  # a stage that failed while draining emptied the queues
        unfinished = self._threads.pending()
        if unfinished:
            self._abort.set()  # an unreachable feature store gives up now
        delivery.finish(deadline, at_least_s=1.0)
        commit_before_leaving(self._delivery, deadline, self._serve_rebalance_paused)
        if unfinished or len(self._committer):
            raise SinkError(
                f"stopped with {len(self._committer)} batches unfinished after "
                f"{self.config.shutdown_timeout_s:.0f}s; their records stay uncommitted and "
                "will be consumed again"
            )

    def _serve_rebalance_paused(self) -> None:
        """Serve a rebalance inside ``consume``, all paused; what it fetches stays uncommitted."""
        self._source.pause(self.assigned)
        self._source.consume(self._max_messages, 0.1)

    def failed(self, exc: BaseException) -> None:
        """Commit nothing on a revoke on the way out; a stalled call leaves the clients."""
        self._membership.commit_on_revoke = False
        self._wedged = isinstance(exc, CallStalled)

    def give_back(self) -> None:
        """Nothing to give back: uncommitted records are consumed again by their owner."""

    def leave(self) -> None:
        """Close the consumer (leaving the group) and the delivery mode's producer."""
        if self._wedged:
            log.info("leaving the Kafka clients unclosed: a call of theirs is stuck")
            return
        try:
            self._source.close()
        except StreamferError as exc:  # a revoke inside close met the same broken producer
            log.warning("closing the consumer failed: %s", exc)
        except Exception:  # close must not hide the error that brought us here
            log.exception("closing the consumer failed")
        self._delivery.close(min(5.0, self.config.shutdown_timeout_s))


def _group_by_pipeline(messages: list[Message], route: dict[str, str]) -> dict[str, list[Message]]:
    groups: dict[str, list[Message]] = {}
    for msg in messages:
        groups.setdefault(route[position(msg)[0]], []).append(msg)
    return groups
