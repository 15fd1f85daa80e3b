"""The delivery tracker: one batch's produced records, counted as the broker reports them.

Each batch gets one ``DeliveryTracker`` whose bound method is the delivery callback of all
its records, so per-record bookkeeping is a counter. It is a plain record shared by the
publisher, the delivery mode and the committer, so it lives below all three.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from confluent_kafka import KafkaError, Message

from worker.core.types import Refusal, Source

__all__ = [
    "INNOCENT",
    "NO_REFUSALS",
    "RECORD_ERRORS",
    "RESENDS_PER_RECORD",
    "DeliveryTracker",
    "Published",
]

RECORD_ERRORS = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_MSG,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_TIMESTAMP,
    }
)
"""Delivery errors about one record, not about the broker or the producer."""

INNOCENT = KafkaError._INVALID_DIFFERENT_RECORD
"""A record refused only because another record of its produce batch was: sent again."""

RESENDS_PER_RECORD = 3
"""How often, on average, a batch's records may be sent again before the batch fails."""

NO_REFUSALS: Mapping[Source, Refusal] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Published:
    """What a batch's tracker keeps of it once published: where a record the broker
    refuses for itself finds the request it was produced for.

    ``rows[i]`` is the position in ``batch`` of the request whose id is ``ids[i]`` (the
    decoded requests); both are empty for a batch whose requests were never decoded (a
    share group's record dead-lettered on its last delivery), whose refused dead letters
    are found by their source. ``model`` (``name:version``) names the model the batch ran
    on, for those dead letters; None: the config's.
    """

    batch: Sequence[Message]
    ids: Sequence[str] = ()
    rows: Sequence[int] = ()
    model: str | None = None


class DeliveryTracker:
    """Counts the deliveries of one batch and keeps the first errors.

    The batch is ``done`` once it is ``sealed`` (every record was handed to the producer)
    and every record was acknowledged or refused. Records are sent from the processing
    thread while delivery reports may arrive on any thread that polls the producer, so
    the acknowledgement count is guarded by a lock, and so are ``undeliverable`` and the
    decision to queue the tracker for dead-lettering: a report may arrive on a processing
    thread while the loop thread takes the batch's earlier refusals.
    """

    __slots__ = (
        "_keep_refused",
        "_lock",
        "_notify",
        "acked",
        "errors",
        "oldest_ts_ms",
        "pipeline",
        "published",
        "refusals",
        "refused",
        "resend",
        "resent",
        "sealed",
        "sealed_at",
        "sent",
        "undeliverable",
    )

    def __init__(
        self,
        pipeline: str = "",
        oldest_ts_ms: int = 0,
        reroute: deque[DeliveryTracker] | None = None,
        *,
        keep_refused: bool = False,
        refusals: Mapping[Source, Refusal] = NO_REFUSALS,
    ) -> None:
        """With ``reroute``, a record the broker refuses for itself (``RECORD_ERRORS``) is
        kept in ``undeliverable``, one refused only for a batch-mate (``INNOCENT``) in
        ``resend``, and the tracker queued there for whoever dead-letters or re-sends
        them; the batch is not done until that is handled. Without, it is a failure;
        ``keep_refused`` (exactly-once, whose transaction must then abort) keeps it in
        ``undeliverable`` as well, for the next try to dead-letter. ``refusals``: the
        requests the broker refused a record of on an earlier try, by source; the
        publisher sends their dead letters instead."""
        self._lock = threading.Lock()
        self._notify = reroute
        self._keep_refused = keep_refused
        self.refusals = refusals
        self.pipeline = pipeline
        self.oldest_ts_ms = oldest_ts_ms
        self.sent = 0
        self.acked = 0
        self.refused = 0
        self.sealed = False
        self.sealed_at = 0.0
        self.errors: list[str] = []
        self.undeliverable: list[tuple[Message, str]] = []
        self.resend: list[Message] = []
        """With ``reroute``: records refused only for a batch-mate (``INNOCENT``)."""
        self.resent = 0
        self.published: Published | None = None
        """Set by the publisher before it seals the tracker: what dead-lettering an
        undeliverable record needs of its batch."""

    @property
    def done(self) -> bool:
        return (
            self.sealed
            and self.acked + self.refused == self.sent
            and not self.undeliverable
            and not self.resend
        )

    @property
    def pending(self) -> int:
        return self.sent - self.acked - self.refused

    def seal(self) -> None:
        """No more records will be sent for this batch."""
        self.sealed_at = time.monotonic()
        self.sealed = True

    def on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        # The error is recorded before the acknowledgement counts: the loop thread may see
        # the batch done the moment ``acked`` reaches ``sent``, and must see its errors then.
        with self._lock:
            if err is not None:
                code = err.code()
                refused = code in RECORD_ERRORS
                if (refused or code == INNOCENT) and self._notify is not None:
                    # queued when both lists were empty, that is when no one holds them to
                    # drain: ``take_undelivered`` empties them under this same lock
                    if not self.undeliverable and not self.resend:
                        self._notify.append(self)
                    if refused:
                        self.undeliverable.append((msg, err.str()))
                    else:
                        self.resend.append(msg)
                else:
                    if refused and self._keep_refused:
                        self.undeliverable.append((msg, err.str()))
                    if len(self.errors) < 10:
                        self.errors.append(f"{msg.topic()}[{msg.partition()}]: {err.str()}")
            self.acked += 1

    def take_undeliverable(self) -> tuple[Message, str] | None:
        """The next record the broker refused for itself and why, for its dead letter, or
        None when there is none left. Whoever took the tracker from the queue calls this
        until None: a refusal reported after that None queues the tracker again, one
        reported before it is returned here, so none is left in a tracker no one holds."""
        with self._lock:
            return self.undeliverable.pop() if self.undeliverable else None

    def take_undelivered(self) -> tuple[Message, str | None] | None:
        """Like ``take_undeliverable``, with the records to send again as well: ``(record,
        None)`` for one refused only for a batch-mate; None once both lists are empty."""
        with self._lock:
            if self.resend:
                return self.resend.pop(), None
            return self.undeliverable.pop() if self.undeliverable else None

    def refused_by_producer(self, topic: str, reason: str) -> None:
        self.refused += 1
        if len(self.errors) < 10:
            self.errors.append(f"{topic}: refused by producer: {reason}")

    def fail(self, reason: str) -> None:
        """The batch as a whole failed (an aborted transaction, say): never commit it."""
        self.errors.append(reason)
