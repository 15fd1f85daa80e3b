"""The processing threads: closed batches run here, off the polling thread, in stages.

The loop thread keeps calling ``consume`` (so the group never sees a stalled member,
however slow the model or the feature store) and hands each closed batch to the
``StageThreads`` as a ``Job``. Each stage has its own thread: in the worker, one decodes
and enriches batch k+2 while the next runs the model on batch k+1 and the last produces
the results of batch k. ONNX Runtime and Redis release the GIL, so the model overlaps
the per-record Python on both sides of it. Every stage takes jobs in submission order,
one at a time, which keeps each partition's results in order; at most ``ahead`` jobs
wait between two stages, so memory stays bounded. An exception in any stage stops them
all and is re-raised on the loop thread by ``check()``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Union

from worker.batch import Job, PartitionKey

__all__ = ["StageThreads", "Start", "Step"]


Step = Callable[[], Union["Step", None]]
"""One stage's work on a job; returns the next stage's work, or None when the job is done."""

Start = Callable[[Job], Step | None]
"""The first stage's work on a job."""


class StageThreads:
    """Runs jobs through ``stages`` threads in a row, first in, first out."""

    def __init__(
        self, start: Start, *, stages: int = 3, ahead: int = 2, name: str = "streamfer"
    ) -> None:
        self._start = start
        self._ahead = ahead
        self._queues: list[deque[tuple[Job, Step | None]]] = [deque() for _ in range(stages)]
        self._running: list[Job | None] = [None] * stages
        self._finished = [False] * stages
        self._cond = threading.Condition()
        self._closed = False
        self._error: BaseException | None = None
        self._threads = [
            threading.Thread(target=self._stage, args=(i,), name=f"{name}-{i}", daemon=True)
            for i in range(stages)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, job: Job) -> None:
        with self._cond:
            self._queues[0].append((job, None))
            self._cond.notify_all()

    def pending(self) -> int:
        """Jobs queued for or running in any stage."""
        with self._cond:
            return len(self._unfinished())

    def busy_with(self, partitions: set[PartitionKey]) -> bool:
        """Whether an unfinished job holds records of any of ``partitions``."""
        with self._cond:
            jobs = self._unfinished()
        return any(partitions.intersection(job.offsets) for job in jobs)

    def discard_queued(self) -> list[Job]:
        """Remove the jobs waiting between stages (a rewind); the last stage produces, so
        nothing of theirs was produced. A job running in a stage still finishes."""
        with self._cond:
            dropped = [job for queue in reversed(self._queues) for job, _ in queue]
            for queue in self._queues:
                queue.clear()
            self._cond.notify_all()
            return dropped

    def check(self) -> None:
        """Re-raise, on the caller's thread, the error that stopped a job."""
        if self._error is not None:
            raise self._error

    def close(self, timeout: float) -> bool:
        """Stop after the queued jobs; True if every thread finished within ``timeout``."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout)
        return not any(thread.is_alive() for thread in self._threads)

    def _unfinished(self) -> list[Job]:
        queued = [job for queue in self._queues for job, _ in queue]
        return queued + [job for job in self._running if job is not None]

    def _stage(self, index: int) -> None:
        cond = self._cond
        inbox = self._queues[index]
        outbox = self._queues[index + 1] if index + 1 < len(self._queues) else None
        while True:
            with cond:
                while self._error is None and (
                    (not inbox and not self._upstream_done(index))
                    or (outbox is not None and len(outbox) >= self._ahead)
                ):
                    cond.wait()
                if self._error is not None or not inbox:
                    self._finished[index] = True
                    cond.notify_all()
                    return
                job, step = inbox.popleft()
                self._running[index] = job
                cond.notify_all()  # room in this stage's inbox
            try:
                following = self._start(job) if step is None else step()
            except BaseException as exc:  # surfaced on the loop thread by check()
                self._stop_with(exc)
                return
            with cond:
                self._running[index] = None
                if following is not None:
                    if outbox is None:
                        self._stop_with(RuntimeError("a job returned work after its last stage"))
                        return
                    outbox.append((job, following))
                cond.notify_all()

    def _upstream_done(self, index: int) -> bool:
        return self._closed if index == 0 else self._finished[index - 1]

    def _stop_with(self, exc: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = exc
            self._running = [None] * len(self._running)
            for queue in self._queues:
                queue.clear()
            self._cond.notify_all()
