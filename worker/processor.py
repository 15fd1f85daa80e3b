"""The processing thread: closed batches run here, off the polling thread.

The loop thread keeps calling ``consume`` (so the group never sees a stalled member,
however slow the model or the feature store) and hands each closed batch to the
``Processor`` as a ``Job``. Jobs run one at a time in submission order, which keeps each
partition's results in order. Redis round trips and ONNX Runtime release the GIL, so the
two threads overlap real work. An exception in a job is kept and re-raised on the loop
thread by ``check()``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Message

from worker.commit import PartitionKey
from worker.sink import DeliveryTracker

__all__ = ["Job", "Processor"]


@dataclass(slots=True)
class Job:
    """One closed batch of one pipeline, and where its outcome is tracked."""

    pipeline: str
    batch: list[Message]
    tracker: DeliveryTracker
    offsets: dict[PartitionKey, int]


class Processor:
    """Runs jobs on one daemon thread, first in, first out."""

    def __init__(self, run: Callable[[Job], None], name: str = "streamfer-processor") -> None:
        self._run = run
        self._jobs: deque[Job] = deque()
        self._cond = threading.Condition()
        self._running: Job | None = None
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self._cond:
            self._jobs.append(job)
            self._cond.notify()

    def pending(self) -> int:
        """Jobs queued or running."""
        with self._cond:
            return len(self._jobs) + (self._running is not None)

    def busy_with(self, partitions: set[PartitionKey]) -> bool:
        """Whether a queued or running job holds records of any of ``partitions``."""
        with self._cond:
            jobs = [*self._jobs, *([self._running] if self._running else [])]
        return any(partitions.intersection(job.offsets) for job in jobs)

    def discard_queued(self) -> list[Job]:
        """Remove jobs that have not started (a rewind); the running one finishes."""
        with self._cond:
            dropped = list(self._jobs)
            self._jobs.clear()
            return dropped

    def check(self) -> None:
        """Re-raise, on the caller's thread, the error that stopped a job."""
        if self._error is not None:
            raise self._error

    def close(self, timeout: float) -> bool:
        """Stop after the queued jobs; True if the thread finished within ``timeout``."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _main(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if not self._jobs:
                    return
                job = self._running = self._jobs.popleft()
            try:
                self._run(job)
            except BaseException as exc:  # surfaced on the loop thread by check()
                self._error = exc
                with self._cond:
                    self._running = None
                    self._jobs.clear()
                return
            with self._cond:
                self._running = None
