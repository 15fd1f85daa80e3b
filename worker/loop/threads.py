"""The processing threads: closed batches run here, off the polling thread, in stages.

The loop thread keeps calling ``consume`` (so the group never sees a stalled member,
however slow the model or the feature store) and hands each closed batch to the
``StageThreads`` as a ``Job``. Each stage has its own thread: in the worker, one decodes
and enriches batch k+2 while the next runs the model on batch k+1 and the last produces
the results of batch k. ONNX Runtime and Redis release the GIL, so the model overlaps
the per-record Python on both sides of it. Every stage takes jobs one at a time from a
``worker.loop.lanes.LaneQueue``: the oldest of the highest lane (a pipeline's priority) whose
next stage has room, in submission order within a lane, which keeps each partition's
results in order; with one lane (every pipeline alike) that is plain submission order.
At most ``ahead`` jobs of a lane wait between two stages, so memory stays bounded and a
lower lane's backlog never fills a higher lane's room; the highest of several lanes is
bounded only by the worker's in-flight bound, so that its small batches are all ready
the moment the model is free. An exception in any stage stops
them all and is re-raised on the loop thread by ``check()``.

All stages share one lock, but each waits on a condition of its own, and a change wakes
only the stage it can let go on: a job handed to a stage wakes that stage, room made in
a stage's queue (a take, a job parked there) wakes the stage before it if jobs wait
there. A hand-off so costs one thread switch, not one per stage, at every small batch.

A step that cannot go on yet raises ``Parked`` (``worker.core.parked``: its pipeline's
model is at fault). The stage sets the job aside and serves other pipelines' jobs; the
same step runs again when the wait it named is over. Until the parked job goes on, the
stage takes no other job of its pipeline (each partition keeps its order), at most
``ahead`` of that pipeline's jobs wait for the stage, and those do not count against the
room of the other pipelines of their lane. ``parked()`` names the pipelines held so, for
the loop to pause their partitions.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Union

from worker.core import Clock, Job, Parked, PartitionKey, monotonic_clock
from worker.loop.lanes import LaneQueue, Taken

__all__ = ["OnTake", "StageThreads", "Start", "Step"]


Step = Callable[[], Union["Step", None]]
"""One stage's work on a job; returns the next stage's work, or None when the job is done."""

Start = Callable[[Job], Step | None]
"""The first stage's work on a job."""

OnTake = Callable[[int, Job, float, bool], None]
"""``(stage index, job, seconds it waited there, aged)``, on the stage's thread when it
takes a job; aged: it went ahead of a higher lane, overtaken for too long."""


@dataclass(frozen=True, slots=True)
class _Aside:
    """A job parked at a stage: the step to run again, at ``due`` (on the clock)."""

    job: Job
    step: Step
    lane: int
    due: float


class StageThreads:
    """Runs jobs through ``stages`` threads in a row, by lane, first in, first out."""

    def __init__(
        self,
        start: Start,
        *,
        stages: int = 3,
        ahead: int = 2,
        name: str = "streamfer",
        lane: Callable[[Job], int] = lambda _job: 0,
        top_lane: int | None = None,
        max_overtaken_s: float = 0.5,
        on_take: OnTake | None = None,
        clock: Clock = monotonic_clock,
    ) -> None:
        """``lane`` gives a job's lane (higher goes first); ``top_lane``, the highest of
        several, is not held to ``ahead``: its jobs are prepared as they come and wait
        only for the stage itself (the worker's in-flight bound still limits them), so
        small latency-sensitive batches never queue for room behind a busy model.
        ``max_overtaken_s`` is how long higher lanes may overtake a lower lane's next job
        at one stage before it goes."""
        self._start = start
        self._ahead = ahead
        self._top_lane = top_lane
        self._lane = lane
        self._on_take = on_take
        self._clock = clock
        self._queues: list[LaneQueue[tuple[Job, Step | None]]] = [
            LaneQueue(max_overtaken_s) for _ in range(stages)
        ]
        self._running: list[Job | None] = [None] * stages
        self._parked: list[dict[str, _Aside]] = [{} for _ in range(stages)]
        """Per stage: the job parked there, by pipeline."""
        self._holding: dict[str, Job] = {}
        """Pipelines with a parked job, and that job (while it is tried again too)."""
        self._finished = [False] * stages
        self._lock = threading.RLock()
        self._wake = [threading.Condition(self._lock) for _ in range(stages)]
        """Per stage: what its thread waits on when it has nothing it may take."""
        self._wakes = [0] * stages
        self._closed = False
        self._error: BaseException | None = None
        self._threads = [
            threading.Thread(target=self._stage, args=(i,), name=f"{name}-{i}", daemon=True)
            for i in range(stages)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, job: Job) -> None:
        lane = self._lane(job)
        with self._lock:
            self._queues[0].append(lane, (job, None), self._clock())
            self._wake[0].notify()

    def pending(self, lane_at_least: int | None = None) -> int:
        """Jobs queued for, running in or parked at any stage; with ``lane_at_least``,
        only those of that lane or a higher one that would go before a job of that lane
        (not parked ones, nor those waiting behind them)."""
        with self._lock:
            jobs = self._unfinished()
            waiting = set(self._holding)
        if lane_at_least is None:
            return len(jobs)
        lane = self._lane
        return sum(1 for j in jobs if lane(j) >= lane_at_least and j.pipeline not in waiting)

    def parked(self) -> frozenset[str]:
        """Pipelines with a job parked at a stage (or being tried again there): nothing
        of theirs goes on meanwhile."""
        with self._lock:
            return frozenset(self._holding)

    def unfinished(self) -> list[Job]:
        """The jobs queued for or running in any stage."""
        with self._lock:
            return self._unfinished()

    def busy_with(self, partitions: set[PartitionKey]) -> bool:
        """Whether an unfinished job holds records of any of ``partitions``."""
        with self._lock:
            jobs = self._unfinished()
        return any(partitions.intersection(job.offsets) for job in jobs)

    def discard_queued(self) -> list[Job]:
        """Remove the jobs waiting between stages (a rewind); the last stage produces, so
        nothing of theirs was produced. A job running in a stage still finishes."""
        with self._lock:
            dropped = [job for queue in reversed(self._queues) for job, _step in queue]
            for queue in self._queues:
                queue.clear()
            self._notify_all()
            return dropped

    def check(self) -> None:
        """Re-raise, on the caller's thread, the error that stopped a job."""
        if self._error is not None:
            raise self._error

    def close(self, timeout: float) -> bool:
        """Stop after the queued jobs; True if every thread finished within ``timeout``."""
        with self._lock:
            self._closed = True
            self._wake[0].notify()
        for thread in self._threads:
            thread.join(timeout)
        return not any(thread.is_alive() for thread in self._threads)

    def wakes(self) -> list[int]:
        """Per stage, how often its thread woke from waiting for a job it may take."""
        with self._lock:
            return list(self._wakes)

    def _unfinished(self) -> list[Job]:
        queued = [job for queue in self._queues for job, _step in queue]
        aside = [a.job for stage in self._parked for a in stage.values()]
        return queued + aside + [job for job in self._running if job is not None]

    def _stage(self, index: int) -> None:
        lock, wake = self._lock, self._wake[index]
        downstream = self._wake[index + 1] if index + 1 < len(self._wake) else None
        inbox = self._queues[index]
        outbox = self._queues[index + 1] if index + 1 < len(self._queues) else None
        here = self._parked[index]
        after = self._parked[index + 1] if outbox is not None else {}
        ahead, top, clock, on_take = self._ahead, self._top_lane, self._clock, self._on_take

        def ready(lane: int, item: tuple[Job, Step | None]) -> bool:
            name = item[0].pipeline
            if name in here:
                return False
            if outbox is None or lane == top:
                return True
            if not after:
                return outbox.count(lane) < ahead
            if name in after:
                return outbox.count(lane, lambda it: it[0].pipeline == name) < ahead
            return outbox.count(lane, lambda it: it[0].pipeline not in after) < ahead

        while True:
            with lock:
                while True:
                    if self._error is not None:
                        taken = None
                    else:
                        taken = self._due(here, clock()) or inbox.take(ready, clock())
                    if taken is not None:
                        break
                    if self._error is not None or (
                        not inbox and not here and self._upstream_done(index)
                    ):
                        self._finished[index] = True
                        if downstream is not None:
                            downstream.notify()
                        return
                    wake.wait(self._next_due(here))
                    self._wakes[index] += 1
                job, step = taken.item
                self._running[index] = job
                self._made_room(index)
            try:
                if on_take is not None and taken.waited_s >= 0.0:
                    on_take(index, job, taken.waited_s, taken.aged)
                following = self._start(job) if step is None else step()
            except Parked as parked:
                with lock:
                    self._running[index] = None
                    if self._error is None:  # not stopped meanwhile
                        again = step if step is not None else functools.partial(self._start, job)
                        due = clock() + parked.after_s
                        here[job.pipeline] = _Aside(job, again, taken.lane, due)
                        self._holding[job.pipeline] = job
                    self._made_room(index)  # its pipeline's jobs leave the lane's room
                continue
            except BaseException as exc:  # surfaced on the loop thread by check()
                self._stop_with(exc)
                return
            with lock:
                self._running[index] = None
                if self._holding.get(job.pipeline) is job:
                    del self._holding[job.pipeline]
                if following is not None:
                    if outbox is None or downstream is None:
                        self._stop_with(RuntimeError("a job returned work after its last stage"))
                        return
                    outbox.append(taken.lane, (job, following), clock())
                    downstream.notify()
            # the values the step held go now, not at the next take: a published batch
            # lets go of the engine it ran on
            del taken, step, following

    def _due(self, here: dict[str, _Aside], now: float) -> Taken[tuple[Job, Step | None]] | None:
        """The parked job whose wait is over (first parked first), taken back; its
        retry is not a take for ``on_take`` (waited_s < 0)."""
        name = next((name for name, aside in here.items() if aside.due <= now), None)
        if name is None:
            return None
        aside = here.pop(name)
        return Taken((aside.job, aside.step), aside.lane, -1.0, False)

    def _next_due(self, here: dict[str, _Aside]) -> float | None:
        """How long a stage with parked jobs may sleep; None: until notified."""
        if not here:
            return None
        return max(0.0, min(aside.due for aside in here.values()) - self._clock())

    def _made_room(self, index: int) -> None:
        """Wake the stage before ``index`` (the caller holds the lock) if it has jobs,
        which may have waited for room at ``index``; with none it waits for a job."""
        if index > 0 and self._queues[index - 1]:
            self._wake[index - 1].notify()

    def _upstream_done(self, index: int) -> bool:
        return self._closed if index == 0 else self._finished[index - 1]

    def _stop_with(self, exc: BaseException) -> None:
        with self._lock:
            if self._error is None:
                self._error = exc
            self._running = [None] * len(self._running)
            for stage in self._parked:
                stage.clear()
            self._holding.clear()
            for queue in self._queues:
                queue.clear()
            self._notify_all()

    def _notify_all(self) -> None:
        """Wake every stage (the caller holds the lock): an error, or every queue cleared."""
        for wake in self._wake:
            wake.notify()
