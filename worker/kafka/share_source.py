"""The share-group source: a member of a KIP-932 share group, acknowledging each record.

A share group hands the records of one partition to all its members; each record is
acquired by one member for the group's record lock (``share.record.lock.duration.ms``)
and stays the member's until it is acknowledged: ACCEPT (done), RELEASE (deliver it
again, to any member) or, when the lock runs out or the member dies, given to another.
The broker counts deliveries and archives a record after the group's
``share.delivery.count.limit``.

The consumer runs with ``share.acknowledgement.mode = explicit``: every record of a poll
must be acknowledged before the next poll (librdkafka refuses the poll otherwise), so a
worker holds at most one poll's records, and ``max.poll.records`` (best effort: the
broker may hand out whole producer batches beyond it) is its bound. Acknowledgements
leave with the next poll or ``send``; the broker's answers come back to
``on_acknowledged`` inside those calls, on the caller's thread. Not thread-safe: the
loop thread only, as for ``Source``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from confluent_kafka import (
    AcknowledgeType,
    IllegalStateException,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from worker.config import KafkaSettings
from worker.kafka.client_logs import KAFKA_LOG
from worker.kafka.source import without_errors

__all__ = ["AcknowledgementAnswer", "ShareClient", "ShareSource", "share_consumer_config"]

log = logging.getLogger(__name__)

AcknowledgementAnswer = Callable[[dict[TopicPartition, set[int]], KafkaException | None], None]
"""The broker's answer to acknowledgements: ``(offsets per partition, error or None)``."""


class ShareClient(Protocol):
    """The part of ``confluent_kafka.ShareConsumer`` the source uses."""

    def subscribe(self, topics: list[str]) -> None: ...

    def poll(self, timeout: float = -1) -> Any: ...

    def acknowledge(self, message: Message, ack_type: AcknowledgeType = ...) -> None: ...

    def commit_async(self) -> None: ...

    def commit_sync(self, timeout: float = 60) -> dict[TopicPartition, KafkaException | None]: ...

    def set_acknowledgement_commit_callback(
        self, callback: AcknowledgementAnswer | None
    ) -> None: ...

    def close(self) -> None: ...


def share_consumer_config(
    settings: KafkaSettings,
    *,
    max_poll_records: int,
    on_error: Callable[[KafkaError], None] | None = None,
    on_stats: Callable[[str], None] | None = None,
    statistics_interval_ms: int = 0,
) -> dict[str, Any]:
    """librdkafka settings of a share consumer; the callbacks run on the polling thread.
    The group's own settings (session, heartbeat, lock, delivery limit, where it starts)
    live on the broker (``worker.kafka.share_group``)."""
    conf: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "group.id": settings.group_id,
        "share.acknowledgement.mode": "explicit",
        "max.poll.records": max_poll_records,
        "max.poll.interval.ms": settings.max_poll_interval_ms,
        "error_cb": on_error if on_error is not None else _log_error,
        "logger": KAFKA_LOG,
    }
    if on_stats is not None and statistics_interval_ms > 0:
        conf["stats_cb"] = on_stats
        conf["statistics.interval.ms"] = statistics_interval_ms
    conf.update(settings.client_options())
    conf.update(settings.consumer_options)
    return conf


def _log_error(err: KafkaError) -> None:
    KAFKA_LOG.error("share consumer error: %s", err.str())


class ShareSource:
    """Polls a share group and acknowledges what it was given (see the module)."""

    def __init__(
        self,
        consumer: ShareClient,
        topics: Sequence[str],
        *,
        on_acknowledged: AcknowledgementAnswer | None = None,
    ) -> None:
        self.consumer = consumer
        self._topics = list(topics)
        self._poll = consumer.poll
        self._acknowledge = consumer.acknowledge
        if on_acknowledged is not None:
            consumer.set_acknowledgement_commit_callback(on_acknowledged)

    def subscribe(self) -> None:
        """Join the share group; the broker assigns partitions, shared with every member."""
        self.consumer.subscribe(self._topics)

    def poll(self, timeout: float) -> list[Message]:
        """The records of one poll (acquired for this member); blocks at most ``timeout``.
        A message that carries an error is skipped as ``end_of_partition`` says; a fatal
        one raises ``SourceError``.

        A poll held longer than ``max.poll.interval.ms`` (a model fault hold, a Redis
        wait) makes librdkafka leave the group and raise ``_MAX_POLL_EXCEEDED`` from the
        next poll; the broker still takes that poll's acknowledgements and hands its
        records to no one else, and this poll joins again: a warning, not a stop."""
        try:
            return without_errors(list(self._poll(timeout)), log)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._MAX_POLL_EXCEEDED:
                raise
            log.warning(
                "%s: the share consumer left the group while the worker served one poll; "
                "it joins again (raise [kafka] max_poll_interval_ms above the longest a "
                "poll may take)",
                exc.args[0].str(),
            )
            return []

    def accept(self, messages: Iterable[Message]) -> int:
        """ACCEPT each record: its result or dead letter is delivered. Returns how many
        the client took; one it refuses (no longer acquired by this member, after a
        rejoin) is left to the broker, which delivers it again."""
        return self._ack(messages, AcknowledgeType.ACCEPT)

    def release(self, messages: Iterable[Message]) -> int:
        """RELEASE each record: not delivered here, the broker delivers it again (its
        delivery count grows by one). Returns how many the client took."""
        return self._ack(messages, AcknowledgeType.RELEASE)

    def _ack(self, messages: Iterable[Message], kind: AcknowledgeType) -> int:
        acknowledge = self._acknowledge
        done = refused = 0
        for msg in messages:
            try:
                acknowledge(msg, kind)
                done += 1
            except IllegalStateException:
                refused += 1
        if refused:
            log.warning(
                "the share consumer no longer holds %d records it was asked to %s; the "
                "broker delivers them again",
                refused,
                kind.name,
            )
        return done

    def send(self) -> None:
        """Send the acknowledgements made so far without waiting; the answers come to
        ``on_acknowledged`` inside a later poll or send."""
        self.consumer.commit_async()

    def commit(self, timeout: float) -> list[str]:
        """Send the acknowledgements made so far and wait up to ``timeout`` for the
        broker; returns the partitions it answered with an error, each with why."""
        try:
            answer = self.consumer.commit_sync(timeout)
        except KafkaException as exc:
            return [f"all partitions: {exc}"]
        return [f"{tp.topic}[{tp.partition}]: {err}" for tp, err in answer.items() if err]

    def close(self) -> None:
        """Leave the group; acknowledgements not sent yet are sent first."""
        self.consumer.close()
