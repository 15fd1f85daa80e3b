"""The worker: one consumer-group member running one or more pipelines.

``Worker.from_config`` is the composition root: it loads and warms every model, checks
Redis, and builds the real consumer, producer and stores before joining the group. The
constructor takes those parts as keyword arguments so tests can hand in others.

The loop is single-threaded: consume → route to the pipeline's batcher → process closed
batches → serve delivery reports → commit the delivered prefix. At most
``max_in_flight_batches`` batches await delivery; past that the loop waits on the
producer. Rebalance callbacks run inside ``consume`` on the same thread: on revoke the
buffered records of revoked partitions are dropped (never produced, so the next owner
takes them without duplicates), deliveries are flushed and what finished is committed
synchronously; on lost they are dropped without a commit. ``stop()`` (from a signal
handler) ends the loop; the worker then drains open batches, commits and leaves.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import cast

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition
from prometheus_client import CollectorRegistry

from worker.batcher import Batcher, Clock, monotonic_clock
from worker.commit import Committer, OffsetConsumer, PartitionKey
from worker.config import WorkerConfig
from worker.engines import OnnxEngine
from worker.errors import CommitError
from worker.features import RedisHashStore
from worker.metrics import Metrics
from worker.pipeline import Pipeline
from worker.sink import Sink
from worker.source import Source, consumer_config, position

__all__ = ["Worker"]

log = logging.getLogger(__name__)


def _partition_of(msg: Message) -> PartitionKey:
    topic, partition, _ = position(msg)
    return (topic, partition)


def _keys(partitions: Sequence[TopicPartition]) -> set[PartitionKey]:
    return {(tp.topic, tp.partition) for tp in partitions}


class Worker:
    """Runs pipelines for one member of the consumer group. Not thread-safe except ``stop``."""

    def __init__(
        self,
        *,
        config: WorkerConfig,
        consumer: Consumer,
        sink: Sink,
        pipelines: Sequence[Pipeline],
        metrics: Metrics,
        clock: Clock = monotonic_clock,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self._sink = sink
        self._pipelines = {p.name: p for p in pipelines}
        self._route = {t: p.name for p in pipelines for t in p.config.request_topics}
        self._batchers: dict[str, Batcher[Message]] = {
            p.name: Batcher(p.config.batch, clock) for p in pipelines
        }
        self._clock = clock
        self._committer = Committer(cast(OffsetConsumer, consumer))
        self._source = Source(
            consumer,
            list(self._route),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        self._stop = threading.Event()
        self._failed = False
        self.assigned: set[PartitionKey] = set()
        self._assigned_at = 0.0

    @classmethod
    def from_config(cls, config: WorkerConfig, registry: CollectorRegistry | None = None) -> Worker:
        """Build real parts; load and warm every model before the group is joined."""
        metrics = Metrics(registry)
        pipelines = []
        for p in config.pipelines:
            engine = OnnxEngine(p.model)
            engine.warm_up(sorted({1, p.batch.max_batch_size}))
            store = RedisHashStore.connect(config.redis, p.features)
            store.ping()
            pipelines.append(
                Pipeline(
                    p,
                    store=store,
                    engine=engine,
                    metrics=metrics.for_pipeline(p.name),
                    retry_feature_store_s=min(30.0, config.kafka.max_poll_interval_ms / 2000.0),
                )
            )
        built: list[Worker] = []
        consumer = Consumer(
            consumer_config(config.kafka, on_commit=lambda e, p: built[0].on_commit(e, p))
        )
        worker = cls(
            config=config,
            consumer=consumer,
            sink=Sink.from_settings(config.kafka),
            pipelines=pipelines,
            metrics=metrics,
        )
        built.append(worker)
        return worker

    def on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """Result of an asynchronous commit; rejected offsets are committed again."""
        failed = [tp for tp in partitions if err is not None or tp.error is not None]
        if failed:
            reason = err.str() if err is not None else str(failed[0].error)
            log.warning("commit of %d partitions rejected (%s); will retry", len(failed), reason)
            self._committer.requeue_failed(failed)

    def stop(self) -> None:
        """Ask the loop to finish; safe from signal handlers and other threads."""
        self._stop.set()

    def run(self, *, burst_idle_s: float | None = None) -> None:
        """Consume until ``stop()``; with ``burst_idle_s`` also stop after that long idle.

        Raises the ``StreamferError`` that stopped it; uncommitted work is then consumed
        again by whoever owns the partitions next.
        """
        self._source.subscribe()
        try:
            self._loop(burst_idle_s)
            self._drain()
        except BaseException:
            self._failed = True
            raise
        finally:
            self._close()

    def _loop(self, burst_idle_s: float | None) -> None:
        cfg = self.config
        source, sink, committer = self._source, self._sink, self._committer
        batchers = self._batchers
        single = next(iter(batchers)) if len(batchers) == 1 else None
        route = self._route
        clock = self._clock
        max_messages = max(p.config.batch.max_batch_size for p in self._pipelines.values())
        poll_s = cfg.poll_timeout_ms / 1000.0
        in_flight_bound = cfg.max_in_flight_batches
        idle_since = time.monotonic()

        while not self._stop.is_set():
            # consume() waits for a full batch or the timeout, so never longer than the
            # earliest window: an open batch's deadline, or an empty one's whole window.
            fetch_started = clock()
            timeout = poll_s
            for batcher in batchers.values():
                deadline = batcher.deadline()
                if deadline is None:
                    timeout = min(timeout, batcher.max_wait_s)
                else:
                    timeout = min(timeout, max(0.0, deadline - fetch_started))
            messages = source.consume(max_messages, timeout)
            if messages:
                idle_since = time.monotonic()
                if single is not None:
                    for batch in batchers[single].add(messages, fetch_started):
                        self._process(single, batch)
                else:
                    for name, items in _group_by_pipeline(messages, route).items():
                        for batch in batchers[name].add(items, fetch_started):
                            self._process(name, batch)
            for name, batcher in batchers.items():
                expired = batcher.expired()
                if expired is not None:
                    self._process(name, expired)
            sink.poll(0)
            self._commit()
            while len(committer) >= in_flight_bound:
                sink.poll(0.005)
                self._commit()
            if (
                burst_idle_s is not None
                and not messages
                and self.assigned
                and not len(committer)
                and time.monotonic() - max(idle_since, self._assigned_at) >= burst_idle_s
                and all(len(b) == 0 for b in batchers.values())
            ):
                log.info("burst: idle for %.1fs, stopping", burst_idle_s)
                break

    def _process(self, name: str, batch: list[Message]) -> None:
        tracker, offsets = self._pipelines[name].handle(batch, self._sink)
        self._committer.track(tracker, offsets)

    def _commit(self, *, asynchronous: bool = True) -> None:
        if self._committer.commit_ready(asynchronous=asynchronous):
            self.metrics.commits.inc()

    def _drain(self) -> None:
        for name, batcher in self._batchers.items():
            rest = batcher.flush()
            if rest:
                self._process(name, rest)
        remaining = self._sink.flush(self.config.shutdown_timeout_s)
        self._commit(asynchronous=False)
        if remaining:
            log.error(
                "shutdown: %d deliveries unconfirmed; their records stay uncommitted", remaining
            )

    def _close(self) -> None:
        try:
            self._source.close()
        except Exception:  # close must not hide the error that brought us here
            log.exception("closing the consumer failed")
        self._sink.flush(min(5.0, self.config.shutdown_timeout_s))

    def _on_assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned |= _keys(partitions)
        self._assigned_at = time.monotonic()
        self.metrics.rebalances.labels("assign").inc()
        log.info("assigned %s; owning %d partitions", _describe(partitions), len(self.assigned))

    def _on_revoke(self, partitions: list[TopicPartition]) -> None:
        keys = _keys(partitions)
        self.metrics.rebalances.labels("revoke").inc()
        dropped = sum(b.drop(keys, _partition_of) for b in self._batchers.values())
        if not self._failed:
            left = self._sink.flush(min(10.0, self.config.shutdown_timeout_s))
            try:
                self._commit(asynchronous=False)
            except CommitError as exc:
                log.warning(
                    "commit on revoke failed, the next owner repeats those records: %s", exc
                )
            if left:
                log.warning("revoke: %d deliveries still unconfirmed", left)
        self._committer.forget(keys)
        self.assigned -= keys
        log.info("revoked %s (dropped %d buffered records)", _describe(partitions), dropped)

    def _on_lost(self, partitions: list[TopicPartition]) -> None:
        keys = _keys(partitions)
        self.metrics.rebalances.labels("lost").inc()
        dropped = sum(b.drop(keys, _partition_of) for b in self._batchers.values())
        self._committer.forget(keys)
        self.assigned -= keys
        log.warning("lost %s (dropped %d buffered records)", _describe(partitions), dropped)


def _group_by_pipeline(messages: list[Message], route: dict[str, str]) -> dict[str, list[Message]]:
    groups: dict[str, list[Message]] = {}
    for msg in messages:
        groups.setdefault(route[position(msg)[0]], []).append(msg)
    return groups


def _describe(partitions: Sequence[TopicPartition]) -> str:
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return ", ".join(f"{t}{sorted(p)}" for t, p in sorted(by_topic.items())) or "nothing"
