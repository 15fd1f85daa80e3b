"""One share-group poll in flight, from the poll until every record of it is acknowledged.

A share consumer in explicit acknowledgement mode may not poll again before each record
of its last poll is acknowledged, so the worker serves one poll at a time: its records
are split into batches (``split``), each a ``Job`` for the processing threads, and
``PollInFlight`` follows the jobs until each is accepted (its deliveries all succeeded)
or released. ``LockBudget`` says how much of a poll the worker can finish within the
group's record lock, from how fast it finished earlier ones. Plain bookkeeping: no I/O,
the clock injected; the loop thread owns both.

A member that dies holding a poll makes the broker deliver every record of it again,
one delivery count higher. Where a record kills every member it goes to, its batch-mates
would follow it to the group's last delivery, and become dead letters with it. So a
record delivered ``isolated_from`` times or more is served alone, each acknowledged
before the next starts (``serving_order``), in ascending offsets on an even delivery
count and descending on an odd one: a killer stops a member holding only what comes
after it one time and only what came before it the next, so its batch-mates are done
within two deliveries and it reaches the last one alone. Serving alone is bounded by the
lock: ``LockBudget`` measures how long one such turn takes, and where the rest would not
fit before the lock budget runs out, they are served in as few groups as fit
(``group_size``) rather than released: each release is a delivery, and a healthy record
must never reach its last delivery (a dead letter, unprocessed) by the worker's own
releases.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from confluent_kafka import Message

from worker.core import Clock, Job
from worker.kafka import Sink, position

__all__ = [
    "LOCK_SHARE",
    "LockBudget",
    "LockGate",
    "PollInFlight",
    "Settled",
    "group_size",
    "isolated_from",
    "keep_within",
    "serving_order",
    "split",
]

LOCK_SHARE = 0.8
"""The part of the record lock a poll may take before what has not started is released:
the rest covers the last batch's publishing and the acknowledgement's way to the broker."""

_MEASURED_SHARE = 0.1
"""A poll counts towards the rate once it took this part of the budget: shorter ones
measure the fixed costs of a turn more than the model."""
_DECAY = 0.8
"""How much a poll's records and seconds still weigh in the rate one poll later."""


def split(
    records: Sequence[Message], route: Mapping[str, str], max_size: Mapping[str, int]
) -> Iterator[tuple[str, list[Message]]]:
    """The records of a poll as batches: by pipeline (``route``: topic -> pipeline), in
    the order they came, each pipeline's cut into the fewest batches of at most its
    ``max_size``, as even as can be (so the stages overlap on a poll of several)."""
    by_pipeline: dict[str, list[Message]] = {}
    for msg in records:
        by_pipeline.setdefault(route[position(msg)[0]], []).append(msg)
    for name, batch in by_pipeline.items():
        parts = math.ceil(len(batch) / max_size[name])
        size, extra = divmod(len(batch), parts)
        start = 0
        for i in range(parts):
            end = start + size + (1 if i < extra else 0)
            yield name, batch[start:end]
            start = end


State = Literal["held", "accepted", "released"]


@dataclass(slots=True)
class _Held:
    job: Job
    state: State = "held"


@dataclass(frozen=True, slots=True)
class Settled:
    """What ``PollInFlight.settle`` found: jobs to accept, and one that failed."""

    accepted: list[Job] = field(default_factory=list)
    failed: list[Job] = field(default_factory=list)


class PollInFlight:
    """The jobs of one poll, each held until it is accepted or released."""

    def __init__(self, jobs: Sequence[Job], polled_at: float, lock_s: float) -> None:
        self._held = [_Held(job) for job in jobs]
        self.polled_at = polled_at
        self.lock_expires = polled_at + lock_s
        """When the broker may hand these records to another member."""
        self.records = sum(len(job.batch) for job in jobs)
        self.over_budget = False
        """Set once the poll outlived the lock budget and what had not started went back."""
        self.accepted = 0
        """Records accepted so far (what the worker finished of this poll)."""

    def held(self) -> list[Job]:
        """Jobs neither accepted nor released yet, in order."""
        return [h.job for h in self._held if h.state == "held"]

    @property
    def open(self) -> bool:
        return any(h.state == "held" for h in self._held)

    def holds(self, jobs: Sequence[Job]) -> bool:
        """Whether any of ``jobs`` is still held."""
        wanted = {id(job) for job in jobs}
        return any(h.state == "held" and id(h.job) in wanted for h in self._held)

    def records_of(self, pipeline: str) -> int:
        """Records of ``pipeline`` still held: its part of the worker's records in flight."""
        return sum(
            len(h.job.batch) for h in self._held if h.state == "held" and h.job.pipeline == pipeline
        )

    def settle(self) -> Settled:
        """Mark the held jobs whose deliveries are all done as accepted, in any order (a
        share group acknowledges records one by one); the done jobs with errors are
        returned as failed (the caller stops the worker, or sends them again) and stay
        held."""
        accepted: list[Job] = []
        failed: list[Job] = []
        for h in self._held:
            if h.state != "held" or not h.job.tracker.done:
                continue
            if h.job.tracker.errors:
                failed.append(h.job)
                continue
            h.state = "accepted"
            accepted.append(h.job)
            self.accepted += len(h.job.batch)
        return Settled(accepted, failed)

    def accepted_of(self, jobs: Sequence[Job]) -> int:
        """Records of ``jobs`` accepted so far."""
        wanted = {id(job) for job in jobs}
        return sum(
            len(h.job.batch) for h in self._held if h.state == "accepted" and id(h.job) in wanted
        )

    def add(self, job: Job) -> None:
        """Hold one more job of this poll (records served alone, as their turn comes)."""
        self._held.append(_Held(job))
        self.records += len(job.batch)

    def release(self, jobs: Sequence[Job]) -> list[Job]:
        """Mark those of ``jobs`` still held as released; returns them."""
        wanted = {id(job) for job in jobs}
        out = []
        for h in self._held:
            if h.state == "held" and id(h.job) in wanted:
                h.state = "released"
                out.append(h.job)
        return out


class LockBudget:
    """How many records a poll may hold: what this worker finishes within ``LOCK_SHARE``
    of the lock, at the rate it finished its recent polls. Unknown (no limit) until it
    has watched polls for ``_MEASURED_SHARE`` of that time in all.

    The rate is records over seconds, both summed over every poll with older polls
    weighing less (``_DECAY`` per poll): a short poll moves it a little, many move it
    far, so one slow poll (a cold start, a Redis hiccup) is outgrown, never stuck."""

    def __init__(self, lock_s: float, clock: Clock, *, share: float = LOCK_SHARE) -> None:
        self.seconds = lock_s * share
        self._clock = clock
        self._records = 0.0
        self._elapsed = 0.0
        self._known = False
        self._turn_s: float | None = None

    def observe(self, finished: int, started: float, ended: float | None = None) -> None:
        """Batches begun at ``started`` and done at ``ended`` (now unless given) finished
        ``finished`` records (those released are not finished: counting them would
        overstate the rate)."""
        elapsed = max(0.0, (self._clock() if ended is None else ended) - started)
        self._records = _DECAY * self._records + finished
        self._elapsed = _DECAY * self._elapsed + elapsed
        if self._elapsed >= _MEASURED_SHARE * self.seconds:
            self._known = True

    def observe_turn(self, started: float) -> None:
        """A turn of serving alone (its records' pass and the acknowledgements before it)
        begun at ``started`` is done: the longest recent one is what the next may take."""
        took = max(0.0, self._clock() - started)
        last = self._turn_s
        self._turn_s = took if last is None else max(took, _DECAY * last)

    @property
    def turn_s(self) -> float | None:
        """How long a turn of serving alone takes, or None before the first."""
        return self._turn_s

    def room(self, at_least: int) -> int | None:
        """Records a poll can finish in time (never below ``at_least``), or None while
        unknown."""
        if not self._known or self._elapsed <= 0.0:
            return None
        return max(at_least, int(self._records / self._elapsed * self.seconds))


def group_size(pending: int, seconds_left: float, turn_s: float | None) -> int:
    """How many of ``pending`` records to serve together in the next turn, so that all
    of them are served within ``seconds_left`` at ``turn_s`` a turn: one while they fit
    (or the time of a turn is unknown), all the rest once no turn fits."""
    if turn_s is None or turn_s <= 0.0 or pending <= 1:
        return 1
    turns = int(seconds_left / turn_s)
    if turns >= pending:
        return 1
    if turns < 1:
        return pending
    return math.ceil(pending / turns)


class LockGate:
    """The share loop's ``BatchGate``: a batch whose record lock has run out is not run
    or produced. The broker has made its records available again, to another member
    that may be serving them now (at the group's last delivery, as a dead letter):
    producing them here too would give a request two outcomes. The margin covers the
    time between the broker's acquisition and the poll's return. The publish thread
    serves earlier batches' delivery reports, as at-least-once's ``ReportPolling``."""

    def __init__(self, sink: Sink, clock: Clock, margin_s: float) -> None:
        self._sink = sink
        self._clock = clock
        self._margin_s = margin_s
        self.expires = float("inf")
        """When the lock of the poll in flight runs out, by this worker's clock (the
        loop thread sets it per poll; the processing threads read it)."""

    def hold(self, poll: PollInFlight) -> None:
        self.expires = poll.lock_expires - self._margin_s

    def stale(self, job: Job) -> bool:
        return self._clock() >= self.expires

    def acknowledge(self) -> None:
        self._sink.poll(0)


def isolated_from(limit: int) -> int:
    """The delivery count from which a record is served alone (see the module): two
    deliveries before the group's ``limit``, never the first."""
    return max(2, limit - 2)


def serving_order(records: Sequence[Message], limit: int) -> tuple[list[Message], list[Message]]:
    """A poll's records below the group's last delivery, as ``(batched, alone)``: those
    delivered fewer than ``isolated_from(limit)`` times go in batches, as they came; the
    others one at a time, by delivery count, then in ascending offsets on an even count
    and descending on an odd one."""
    first = isolated_from(limit)
    batched, alone = [], []
    for msg in records:
        count = msg.delivery_count() or 1
        if count < first:
            batched.append(msg)
        elif count < limit:
            alone.append(msg)

    def order(msg: Message) -> tuple[int, str, int, int]:
        count = msg.delivery_count() or 1
        topic, partition, offset = position(msg)
        sign = 1 if count % 2 == 0 else -1
        return count, topic, partition, sign * offset

    alone.sort(key=order)
    return batched, alone


def keep_within(records: list[Message], room: int | None) -> tuple[list[Message], list[Message]]:
    """``records`` cut at ``room``: those to serve (the oldest first, as they came) and
    those to give back at once. Everything is served while ``room`` is unknown."""
    if room is None or len(records) <= room:
        return records, []
    return records[:room], records[room:]
