"""A share poll's records on their last delivery: dead-lettered before anything runs them.

A record delivered as often as the group's ``share.delivery.count.limit`` allows becomes
a ``redelivered`` dead letter (stage ``consume``) before anything runs it: it may be
what stopped the members it went to. The broker archives it whatever becomes of it now
(released, its lock expired, its member gone), so it is never released: a dead letter
that fails for a reason not about the record (the topic not authorised, a delivery
timeout) is sent again every ``RESEND_S``, as an outage, until it is delivered or the
worker stops. One job each, so that a failed dead letter is sent again alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import Message

from worker.core import Clock, DeliveryTracker, Job, Published
from worker.kafka import Sink, position
from worker.loop.metrics import ShareMetrics
from worker.loop.share_poll import PollInFlight

__all__ = ["RESEND_S", "LastDeliveries", "UnservedLetters"]

log = logging.getLogger(__name__)

RESEND_S = 1.0
"""How long a failed last-delivery dead letter waits before it is sent again."""


class UnservedLetters(Protocol):
    """What a share group asks of a pipeline (``Pipeline``): the dead letter of a request
    it will not serve, and those of records the broker refused (``RefusedRecords``)."""

    def dead_letter_unserved(
        self,
        sink: Sink,
        tracker: DeliveryTracker,
        msg: Message,
        code: str,
        reason: str,
        *,
        delivery_count: int | None = None,
    ) -> None: ...


@dataclass(slots=True)
class _LastDelivery:
    """A record on its last delivery, its dead letter's job, and when to send it again."""

    pipeline: str
    msg: Message
    count: int
    resend_at: float | None = None


class LastDeliveries:
    """The poll in flight's last-delivery dead letters, by ``id`` of their job. Loop
    thread only."""

    def __init__(
        self,
        *,
        limit: int,
        route: Mapping[str, str],
        pipelines: Mapping[str, UnservedLetters],
        sink: Sink,
        tracker: Callable[[str, int], DeliveryTracker],
        metrics: Mapping[str, ShareMetrics],
        clock: Clock,
        warn: Callable[..., None],
    ) -> None:
        """``tracker`` makes a dead letter's tracker (``RefusedRecords.tracker``);
        ``warn(key, message, *args)`` logs a warning that repeats at most so often."""
        self._limit = limit
        self._route = route
        self._pipelines = pipelines
        self._sink = sink
        self._tracker = tracker
        self._metrics = metrics
        self._clock = clock
        self._warn = warn
        self._last: dict[int, _LastDelivery] = {}

    def __contains__(self, job: Job) -> bool:
        return id(job) in self._last

    def clear(self) -> None:
        """The poll is settled: forget its last deliveries."""
        self._last = {}

    def dead_letter(self, records: Sequence[Message]) -> list[Job]:
        """Count records delivered before; dead-letter those on their last delivery.
        Returns the jobs of those dead letters (sealed), one per record."""
        limit, route = self._limit, self._route
        last: dict[str, list[Message]] = {}
        for msg in records:
            count = msg.delivery_count() or 1
            if count > 1:
                name = route[position(msg)[0]]
                self._metrics[name].redeliveries.inc()
                if count >= limit:
                    last.setdefault(name, []).append(msg)
        jobs = []
        for name, batch in last.items():
            for msg in batch:  # one job each: a failed dead letter is sent again alone
                job = Job.close(name, [msg], self._tracker)
                job.tracker.published = Published([msg])  # refused for itself: again, bare
                last_delivery = _LastDelivery(name, msg, msg.delivery_count() or limit)
                self._last[id(job)] = last_delivery
                self._send(job, last_delivery)
                job.tracker.seal()
                jobs.append(job)
            log.warning(
                "pipeline %s: %d records on their last allowed delivery (%d): dead-lettered "
                "unprocessed (code redelivered)",
                name,
                len(batch),
                limit,
            )
        return jobs

    def resend(self, poll: PollInFlight) -> None:
        """Send again the last-delivery dead letters whose wait is over."""
        now = self._clock()
        for job in poll.held():
            last = self._last.get(id(job))
            if last is not None and last.resend_at is not None and now >= last.resend_at:
                last.resend_at = None
                job.tracker.errors.clear()
                self._send(job, last)

    def failed(self, job: Job) -> bool:
        """A job's deliveries failed: where it is a last delivery's dead letter, send it
        again after ``RESEND_S`` (True); False for any other job."""
        last = self._last.get(id(job))
        if last is None:
            return False
        if last.resend_at is None:
            last.resend_at = self._clock() + RESEND_S
            self._warn(
                "resend",
                "the dead letter of a record on its last delivery failed (%s); it is "
                "sent again every %gs and the record held until it is delivered (the "
                "broker would archive it)",
                "; ".join(job.tracker.errors),
                RESEND_S,
            )
        return True

    def lost(self, held: Sequence[Job]) -> None:
        """The worker stops holding ``held``: a last delivery whose dead letter is still
        undelivered is archived by the broker whatever is done now: say which."""
        for job in held:
            last = self._last.get(id(job))
            if last is None:
                continue
            log.error(
                "stopping before the dead letter of %s[%d]@%d (delivery %d, the share "
                "group's last) was delivered: the broker archives it with no result and "
                "no dead letter",
                *position(last.msg),
                last.count,
            )

    def _send(self, job: Job, last: _LastDelivery) -> None:
        self._pipelines[last.pipeline].dead_letter_unserved(
            self._sink,
            job.tracker,
            last.msg,
            "redelivered",
            _reason(last.count, self._limit),
            delivery_count=last.count,
        )


def _reason(count: int, limit: int) -> str:
    """The reason of a record's ``redelivered`` dead letter."""
    return (
        f"delivered {count} times, the share group's limit (share.delivery.count.limit = "
        f"{limit}): dead-lettered before it is processed, since the broker archives it after "
        "this delivery (it may be what stopped the members it was delivered to)"
    )
