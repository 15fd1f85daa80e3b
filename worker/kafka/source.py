"""The Kafka source: a consumer-group member with manual offset control.

Cooperative-sticky assignment (or the one-round assignor ``[kafka] assignor`` names),
``enable.auto.commit=false`` and ``enable.auto.offset.store=false``: offsets move only
through ``commit.Committer``.
Rebalance callbacks are wired explicitly; they run inside ``consume`` on the caller's
thread, so the worker's state needs no locks. A rewind seeks through ``Source.seek``, so
that a record fetched before it and not handed out yet is dropped: it is fetched again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from worker.config import KafkaSettings
from worker.core import PartitionKey
from worker.errors import MemberFenced, SourceError
from worker.kafka.client_logs import KAFKA_LOG

__all__ = [
    "RebalanceListener",
    "Source",
    "consumer_config",
    "end_of_partition",
    "fatal_error",
    "is_fatal",
    "position",
    "without_errors",
]

log = logging.getLogger(__name__)

_Handler = Callable[[list[TopicPartition]], None]


class RebalanceListener(Protocol):
    """What the group's rebalances are told to (``worker.loop.membership.Membership``);
    each runs inside ``consume``, on the thread that consumes."""

    def on_assign(self, partitions: list[TopicPartition]) -> None: ...

    def on_revoke(self, partitions: list[TopicPartition]) -> None: ...

    def on_lost(self, partitions: list[TopicPartition]) -> None: ...


def position(msg: Message) -> tuple[str, int, int]:
    """Topic, partition and offset of a consumed (never None) message."""
    return cast(str, msg.topic()), cast(int, msg.partition()), cast(int, msg.offset())


def end_of_partition(err: KafkaError, logger: logging.Logger = log) -> bool:
    """Whether a consumed message that carries ``err`` instead of a record only marks the
    end of its partition. Any other error is skipped as well, after a warning on
    ``logger``, unless it is fatal: that raises ``SourceError``."""
    if err.code() == KafkaError._PARTITION_EOF:
        return True
    if is_fatal(err):
        raise fatal_error(err)
    hint = _HINTS.get(err.code())
    logger.warning("consumer: %s%s", err.str(), f": {hint}" if hint else "")
    return False


_HINTS = {
    KafkaError.INCONSISTENT_GROUP_PROTOCOL: (
        "the group's members offer another assignor ([kafka] assignor) or protocol; this "
        "worker is refused, and owns nothing, until every member offers the same one"
    ),
}
"""What a refusal that is not fatal means for a worker, where the broker's words alone
do not say."""


_FATAL_HINTS = {
    "instance ID is still used": (
        'under group_protocol = "consumer" a member whose group_instance_id another '
        "member still holds is refused (the classic protocol fenced the old one instead) "
        "until that one leaves or the broker's group.consumer.session.timeout.ms expires "
        "it: a restart after that joins"
    ),
}
"""What a fatal error means for a worker, where the broker's words alone do not say."""

_FENCED_MEMBER = "same group.instance.id"
"""How librdkafka words FENCED_INSTANCE_ID; its fatal error arrives as ``_FATAL`` with
the cause only in the text."""


def is_fatal(err: KafkaError) -> bool:
    """Whether the consumer can do nothing more: librdkafka hands a fatal error over as
    ``_FATAL`` (the cause in its text), sometimes only to ``error_cb``."""
    return bool(err.fatal()) or err.code() == KafkaError._FATAL


def fatal_error(err: KafkaError) -> SourceError:
    """The ``SourceError`` that stops the worker for ``err``, with what it means: a
    ``MemberFenced`` for a static member the group fenced, which starts again in place."""
    text = err.str()
    if err.code() == KafkaError.FENCED_INSTANCE_ID or _FENCED_MEMBER in text:
        return MemberFenced(
            f"fatal consumer error: {text}. librdkafka fences its own static member after a "
            "session timeout (it heartbeats without its member id), as when the group "
            "coordinator's broker went away; if this repeats with no broker fault, two "
            "workers share this group_instance_id; stopping"
        )
    hint = next((h for cause, h in _FATAL_HINTS.items() if cause in text), None)
    return SourceError(
        f"fatal consumer error: {text}" + (f". {hint}" if hint else "") + "; stopping"
    )


def without_errors(messages: list[Message], logger: logging.Logger = log) -> list[Message]:
    """The records of ``messages``, skipping errors as ``end_of_partition`` does (warning
    on ``logger``); ``messages`` itself when none carries an error (the usual case, one
    pass)."""
    if not any(m.error() is not None for m in messages):
        return messages
    good = []
    for m in messages:
        err = m.error()
        if err is None:
            good.append(m)
        else:
            end_of_partition(err, logger)
    return good


CommitCallback = Callable[[KafkaError | None, list[TopicPartition]], None]


def consumer_config(
    settings: KafkaSettings,
    on_commit: CommitCallback | None = None,
    *,
    on_error: Callable[[KafkaError], None] | None = None,
    on_stats: Callable[[str], None] | None = None,
    statistics_interval_ms: int = 0,
    read_committed: bool = False,
) -> dict[str, Any]:
    """librdkafka settings; the callbacks run on the thread that calls ``consume``."""
    conf: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "group.id": settings.group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": settings.auto_offset_reset,
        "max.poll.interval.ms": settings.max_poll_interval_ms,
        "error_cb": on_error if on_error is not None else _log_error,
        "on_commit": on_commit if on_commit is not None else _log_commit,
        "logger": KAFKA_LOG,
    }
    if settings.group_protocol == "consumer":
        conf["group.protocol"] = "consumer"  # KIP-848: the broker assigns, incrementally
    else:
        conf["partition.assignment.strategy"] = settings.assignor
        conf["session.timeout.ms"] = settings.session_timeout_ms
        conf["heartbeat.interval.ms"] = settings.heartbeat_interval_ms
    if on_stats is not None and statistics_interval_ms > 0:
        conf["stats_cb"] = on_stats
        conf["statistics.interval.ms"] = statistics_interval_ms
    if read_committed:
        conf["isolation.level"] = "read_committed"
    if settings.group_instance_id:
        conf["group.instance.id"] = settings.group_instance_id
    conf.update(settings.client_options())
    conf.update(settings.consumer_options)
    return conf


def _log_error(err: KafkaError) -> None:
    KAFKA_LOG.error("consumer error: %s", err.str())


def _log_commit(err: KafkaError | None, partitions: list[TopicPartition]) -> None:
    if err is not None:
        log.warning("offset commit failed: %s", err.str())


_GROUP_MOVED_ON = frozenset(
    {
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.FENCED_INSTANCE_ID,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
    }
)
"""Commit refusals a retry inside the rebalance callback cannot mend: the group's next
rebalance waits for the callback to return, and authorization does not change."""


def _worth_retrying(err: KafkaError | None) -> bool:
    return err is not None and err.code() not in _GROUP_MOVED_ON


def _report_pins(starts: list[TopicPartition], refused: dict[PartitionKey, KafkaError]) -> None:
    """Log which partitions ``pin_starts`` pinned, and warn of those it could not."""
    pinned = [tp for tp in starts if (tp.topic, tp.partition) not in refused]
    if pinned:
        log.info(
            "pinned the start of partitions the group had not committed: %s",
            ", ".join(f"{tp.topic}[{tp.partition}]@{tp.offset}" for tp in pinned),
        )
    if refused:
        log.warning(
            "the broker refused to pin the start of %s; until this worker commits them, a "
            "crash or rewind begins at a later log end (auto.offset.reset = latest) and "
            "skips what was consumed here",
            ", ".join(f"{t}[{p}] ({err.str()})" for (t, p), err in sorted(refused.items())),
        )


class Source:
    """Fetches messages in batches; surfaces fatal errors as ``SourceError``."""

    def __init__(
        self,
        consumer: Consumer,
        topics: Sequence[str],
        *,
        pin_latest: bool = False,
        rejoin: threading.Event | None = None,
    ) -> None:
        """With ``pin_latest`` (``auto.offset.reset = latest``), ``pin_starts`` commits
        where each newly assigned partition without a committed offset begins. Once
        ``rejoin`` is set (``worker.kafka.group_coverage``), the next fetch leaves the group and
        joins it again first."""
        self._pin_latest = pin_latest
        self._rejoin = rejoin
        self.consumer = consumer
        self._topics = list(topics)
        self._listener: RebalanceListener | None = None
        self._consume = consumer.consume
        self._poll = consumer.poll
        self._moved: set[PartitionKey] = set()
        """Partitions revoked, lost or sought since ``consume_first`` took its first
        record."""

    def subscribe(self, listener: RebalanceListener) -> None:
        """Join the group; every rebalance from now on is told to ``listener``."""
        self._listener = listener
        self._subscribe(listener)

    def _subscribe(self, listener: RebalanceListener) -> None:
        self.consumer.subscribe(
            self._topics,
            on_assign=lambda _c, parts: self._assign(listener, parts),
            on_revoke=lambda _c, parts: self._revoke(listener.on_revoke, parts),
            on_lost=lambda _c, parts: self._revoke(listener.on_lost, parts),
        )

    def _assign(self, listener: RebalanceListener, partitions: list[TopicPartition]) -> None:
        if self._pin_latest and partitions:
            self.pin_starts(partitions)
        listener.on_assign(partitions)

    def pin_starts(self, partitions: list[TopicPartition], timeout: float = 10.0) -> None:
        """Commit the log end as the start of each partition the group has no committed
        offset for, before its first record is fetched. With ``auto.offset.reset =
        latest`` a rewind, or the next owner after a crash, would otherwise begin again at
        a later end of the log and skip what this worker consumed but had not committed.
        (With ``earliest`` they begin at the log start: nothing is skipped, so nothing is
        pinned.) A commit here delays the first fetch of the group by a second or two, once.

        This runs in the assignment callback, so it stays short: a partition whose
        committed offset cannot be read is left alone (pinning over an offset that may
        exist would skip), one the broker refuses to pin is tried once more unless the
        refusal says the group moved on, and a broker that does not answer leaves the
        partitions unpinned. Each is named in a warning; until this worker's first commit
        of such a partition, a crash or rewind may skip what it consumed meanwhile."""
        try:
            starts = self._unpinned_ends(partitions, timeout)
            if not starts:
                return
            refused = self._commit_starts(starts)
        except KafkaException as exc:
            log.warning("could not pin the start of newly assigned partitions: %s", exc)
            return
        again = [tp for tp in starts if _worth_retrying(refused.get((tp.topic, tp.partition)))]
        if again:
            for tp in again:
                del refused[(tp.topic, tp.partition)]
            refused.update(self._commit_starts(again))
        _report_pins(starts, refused)

    def _unpinned_ends(
        self, partitions: list[TopicPartition], timeout: float
    ) -> list[TopicPartition]:
        """The log end of each of ``partitions`` the group has no committed offset for;
        those whose committed offset the broker could not read are left out, with a
        warning. Raises KafkaException."""
        consumer = self.consumer
        starts, unread = [], []
        for tp in consumer.committed(partitions, timeout=timeout):
            if tp.error is not None:
                unread.append(f"{tp.topic}[{tp.partition}] ({tp.error.str()})")
            elif tp.offset < 0:
                _low, high = consumer.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=timeout, cached=False
                )
                starts.append(TopicPartition(tp.topic, tp.partition, high))
        if unread:
            log.warning(
                "could not read the committed offsets of %s: not pinning their start; if "
                "none is committed, a crash or rewind before this worker commits them "
                "begins at a later log end (auto.offset.reset = latest)",
                ", ".join(unread),
            )
        return starts

    def _commit_starts(self, starts: list[TopicPartition]) -> dict[PartitionKey, KafkaError]:
        """Commit ``starts`` synchronously; returns the partitions the broker refused, each
        with its error (a commit that raises refuses them all)."""
        try:
            answer = self.consumer.commit(offsets=starts, asynchronous=False)
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            failure = err or KafkaError(KafkaError._FAIL, str(exc))
            return {(tp.topic, tp.partition): failure for tp in starts}
        return {(tp.topic, tp.partition): tp.error for tp in answer or [] if tp.error is not None}

    def check_retention(self, partitions: set[PartitionKey]) -> None:
        """Say loudly when a committed offset lies below the log start: retention deleted
        records this group never processed, and the consumer will skip past them."""
        if not partitions:
            return
        consumer = self.consumer
        try:
            committed = consumer.committed(
                [TopicPartition(t, p) for t, p in sorted(partitions)], timeout=10
            )
            for tp in committed:
                if tp.offset < 0:
                    continue
                low, _high = consumer.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=10
                )
                if tp.offset < low:
                    log.error(
                        "%s[%d]: committed offset %d is below the log start %d: %d records were "
                        "deleted by retention before this group processed them",
                        tp.topic,
                        tp.partition,
                        tp.offset,
                        low,
                        low - tp.offset,
                    )
        except KafkaException as exc:
            log.warning("could not check committed offsets: %s", exc)

    def _revoke(self, handler: _Handler, partitions: list[TopicPartition]) -> None:
        self._moved.update((tp.topic, tp.partition) for tp in partitions)
        handler(partitions)

    def _rejoin_if_asked(self) -> None:
        """Unsubscribe and subscribe again: a LeaveGroup and a fresh join, which makes
        the coordinator rebalance (subscribing again alone does nothing). What this
        member owns is revoked through ``on_revoke`` inside the next fetch."""
        rejoin, listener = self._rejoin, self._listener
        if rejoin is not None and rejoin.is_set() and listener is not None:
            rejoin.clear()
            log.info("leaving the group and joining again")
            self.consumer.unsubscribe()
            self._subscribe(listener)

    def consume(self, max_messages: int, timeout: float) -> list[Message]:
        """Up to ``max_messages`` records; blocks at most ``timeout`` seconds."""
        self._rejoin_if_asked()
        messages: list[Message] = self._consume(max_messages, timeout)
        return without_errors(messages)

    def consume_first(self, max_messages: int, timeout: float) -> list[Message]:
        """Like ``consume``, but returns as soon as one record is there, with whatever
        else is already fetched: ``consume`` waits for a full batch or the timeout, which
        would hold a lone request for the whole window. A first record whose partition is
        revoked or rewound (``seek``) while the rest is fetched is dropped: the next owner
        serves it, or it is fetched again after the seek. (librdkafka itself drops what a
        seek inside one call outdates.)"""
        self._rejoin_if_asked()
        first: Message | None = self._poll(timeout)
        if first is None:
            return []
        self._moved.clear()
        rest: list[Message] = self._consume(max_messages - 1, 0) if max_messages > 1 else []
        messages = [first, *rest]
        if self._moved and (first.topic(), first.partition()) in self._moved:
            messages = rest
        return without_errors(messages)

    def seek(self, partition: TopicPartition) -> None:
        """Fetch ``partition`` from its offset next (a rewind); a record of it fetched
        before and not handed out yet is dropped."""
        self.consumer.seek(partition)
        self._moved.add((partition.topic, partition.partition))

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        """The group's committed offsets of ``partitions``. Raises KafkaException."""
        return self.consumer.committed(partitions, timeout=timeout)

    def consumer_group_metadata(self) -> object:
        """What a transaction sends with its offsets (``send_offsets_to_transaction``)."""
        return self.consumer.consumer_group_metadata()

    def pause(self, partitions: set[PartitionKey]) -> None:
        """Stop fetching ``partitions``; ``consume`` must still be called to stay in the group."""
        if partitions:
            self.consumer.pause([TopicPartition(t, p) for t, p in sorted(partitions)])

    def resume(self, partitions: set[PartitionKey]) -> None:
        if partitions:
            self.consumer.resume([TopicPartition(t, p) for t, p in sorted(partitions)])

    def close(self) -> None:
        self.consumer.close()
