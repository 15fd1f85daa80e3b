"""The processing threads: closed batches run here, off the polling thread, in stages.

The loop thread keeps calling ``consume`` (so the group never sees a stalled member,
however slow the model or the feature store) and hands each closed batch to the
``StageThreads`` as a ``Job``. A job goes through the stages in a row (in the worker:
decode and enrich, run the model, publish), and each stage runs one job at a time, so
one thread decodes and enriches batch k+2 while another runs the model on batch k+1 and
a third produces the results of batch k. ONNX Runtime and Redis release the GIL, so the
model overlaps the per-record Python on both sides of it. Every stage takes jobs one at
a time from a ``worker.loop.lanes.LaneQueue``: the oldest of the highest lane (a
pipeline's priority) whose next stage has room, in submission order within a lane, which
keeps each partition's results in order; with one lane (every pipeline alike) that is
plain submission order. At most ``ahead`` jobs of a lane wait between two stages, so
memory stays bounded and a lower lane's backlog never fills a higher lane's room; the
highest of several lanes is bounded only by the worker's in-flight bound, so that its
small batches are all ready the moment the model is free. An exception in any stage
stops them all and is re-raised on the loop thread by ``check()``.

The threads are a pool, one per stage, not one bound to each stage: a thread that
finishes a job's step goes on with that job's next step itself when the next stage is
free and nothing waits for it, and otherwise queues the job there and takes whatever
work is ready. At a steady rate, where a batch meets idle stages, a batch so costs no
hand-off between threads at all (each one a futex wake, a thread switch and the GIL
changing hands: 25-30 us of CPU, measured with this class alone), and under a backlog
the stages overlap as before. All threads share one lock and one
condition; a thread that leaves work it cannot take wakes one idle thread, which wakes
the next if it too leaves some.

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
    """Runs jobs through ``stages`` stages in a row, by lane, first in, first out."""

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
        self._ready = [self._readiness(index) for index in range(stages)]
        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)
        """What a thread with nothing it may take waits on."""
        self._wakes = 0
        self._closed = False
        self._error: BaseException | None = None
        self._threads = [
            threading.Thread(target=self._serve, name=f"{name}-{i}", daemon=True)
            for i in range(stages)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, job: Job) -> None:
        lane = self._lane(job)
        with self._lock:
            self._queues[0].append(lane, (job, None), self._clock())
            if self._running[0] is None:  # else the thread running it looks when done
                self._idle.notify()

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
            self._idle.notify_all()
            return dropped

    def check(self) -> None:
        """Re-raise, on the caller's thread, the error that stopped a job."""
        if self._error is not None:
            raise self._error

    def close(self, timeout: float) -> bool:
        """Stop after the queued jobs; True if every thread finished within ``timeout``."""
        with self._lock:
            self._closed = True
            self._idle.notify_all()
        for thread in self._threads:
            thread.join(timeout)
        return not any(thread.is_alive() for thread in self._threads)

    def wakes(self) -> int:
        """How often a thread woke from waiting for a job it may take."""
        with self._lock:
            return self._wakes

    def _unfinished(self) -> list[Job]:
        queued = [job for queue in self._queues for job, _step in queue]
        aside = [a.job for stage in self._parked for a in stage.values()]
        return queued + aside + [job for job in self._running if job is not None]

    def _readiness(self, index: int) -> Callable[[int, tuple[Job, Step | None]], bool]:
        """Whether stage ``index`` may take an item now: its pipeline has no job parked
        there, and the next stage has room for it."""
        here = self._parked[index]
        last = index + 1 == len(self._queues)
        outbox = None if last else self._queues[index + 1]
        after = {} if last else self._parked[index + 1]
        ahead, top = self._ahead, self._top_lane

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

        return ready

    def _serve(self) -> None:
        """One pool thread: take a job's step, run it, go on with its next step while
        the next stage is free, else queue it there and take what is ready."""
        lock, on_take = self._lock, self._on_take
        carried: tuple[int, Taken[tuple[Job, Step | None]]] | None = None
        while True:
            if carried is None:
                with lock:
                    carried = self._next_work()
                if carried is None:
                    return
            index, taken = carried
            carried = None
            job, step = taken.item
            try:
                if on_take is not None and taken.waited_s >= 0.0:
                    on_take(index, job, taken.waited_s, taken.aged)
                following = self._start(job) if step is None else step()
            except Parked as parked:
                with lock:
                    self._park(index, taken, step, parked.after_s)
                continue
            except BaseException as exc:  # surfaced on the loop thread by check()
                self._stop_with(exc)
                return
            with lock:
                carried = self._finished(index, taken, following)
            # the values the step held go now, not at the next take: a published batch
            # lets go of the engine it ran on
            del taken, step, following

    def _next_work(self) -> tuple[int, Taken[tuple[Job, Step | None]]] | None:
        """The next step this thread runs (the caller holds the lock), the latest stage
        first; waits while there is none. None: stop (an error, or closed and done)."""
        while True:
            if self._error is not None:
                return None
            now = self._clock()
            for index in reversed(range(len(self._queues))):
                if self._running[index] is not None:
                    continue
                taken = self._due(self._parked[index], now) or self._queues[index].take(
                    self._ready[index], now
                )
                if taken is not None:
                    self._running[index] = taken.item[0]
                    self._pass_on()
                    return index, taken
            if self._closed and not self._unfinished():
                self._idle.notify_all()
                return None
            self._idle.wait(self._next_due(now))
            self._wakes += 1

    def _finished(
        self, index: int, taken: Taken[tuple[Job, Step | None]], following: Step | None
    ) -> tuple[int, Taken[tuple[Job, Step | None]]] | None:
        """Settle a step that ran (the caller holds the lock): the job's next step to run
        on this thread at once, when its stage is free and nothing waits there, or None
        (queued there, or done) and the thread takes what is ready."""
        job = taken.item[0]
        self._running[index] = None
        if self._holding.get(job.pipeline) is job:
            del self._holding[job.pipeline]
        if following is None or self._error is not None:
            return None
        after = index + 1
        if after == len(self._queues):
            self._stop_with(RuntimeError("a job returned work after its last stage"))
            return None
        item = (job, following)
        now = self._clock()
        if (
            self._running[after] is None
            and not self._queues[after]
            and not self._parked[after]
            and self._ready[after](taken.lane, item)
        ):
            self._running[after] = job
            self._pass_on()  # the stage this thread leaves may have work for another
            return after, Taken(item, taken.lane, 0.0, False)
        self._queues[after].append(taken.lane, item, now)
        return None

    def _park(
        self, index: int, taken: Taken[tuple[Job, Step | None]], step: Step | None, after_s: float
    ) -> None:
        """Set a job aside at its stage until ``after_s`` from now (the caller holds the
        lock); every idle thread looks again, for the work its pipeline held up and to
        wait no longer than the new due time."""
        job = taken.item[0]
        self._running[index] = None
        if self._error is None:  # not stopped meanwhile
            again = step if step is not None else functools.partial(self._start, job)
            due = self._clock() + after_s
            self._parked[index][job.pipeline] = _Aside(job, again, taken.lane, due)
            self._holding[job.pipeline] = job
        self._idle.notify_all()

    def _pass_on(self) -> None:
        """Wake one idle thread (the caller holds the lock) if a free stage has work it
        may take, or a job parked whose due time an idle thread must wait for."""
        for index, running in enumerate(self._running):
            if running is None and (
                self._parked[index] or self._queues[index].has_ready(self._ready[index])
            ):
                self._idle.notify()
                return

    def _due(self, here: dict[str, _Aside], now: float) -> Taken[tuple[Job, Step | None]] | None:
        """The parked job whose wait is over (first parked first), taken back; its
        retry is not a take for ``on_take`` (waited_s < 0)."""
        if not here:
            return None
        name = next((name for name, aside in here.items() if aside.due <= now), None)
        if name is None:
            return None
        aside = here.pop(name)
        return Taken((aside.job, aside.step), aside.lane, -1.0, False)

    def _next_due(self, now: float) -> float | None:
        """How long an idle thread may sleep: until the first parked job at a free stage
        is due; None: until notified."""
        dues = [
            aside.due
            for index, here in enumerate(self._parked)
            if self._running[index] is None
            for aside in here.values()
        ]
        return max(0.0, min(dues) - now) if dues else None

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
            self._idle.notify_all()
