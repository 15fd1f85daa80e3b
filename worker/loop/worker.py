"""The worker: one member of a consumer group or a share group running its pipelines.

One loop for both kinds of group. The constructor takes its parts ready-made:
``worker.compose.wire_worker`` builds them around the real clients, or around fakes in
tests. What the kind of group decides, how records are acquired and how their outcome is
settled, is behind ``Group`` (``worker.loop.group``): ``ConsumerGroup`` commits offsets,
``ShareGroup`` acknowledges records one by one.

Four threads. The loop thread owns the group's client: each turn it checks its health
(the liveness beat, a failed processing stage, a fatal client error), acquires records
and hands their batches to the processing threads, and settles what they finished. The
processing threads (``worker.loop.threads``) decode and enrich one batch while the model
runs on the one before and the one before that is produced, each stage one batch at a
time in order; pipelines of different ``priority`` share them by lane
(``worker.loop.lanes``), and a pipeline whose model is at fault is parked there while the
others go on (``StageThreads.parked``).

``stop()`` (from a signal handler) ends the loop; the group then drains what it holds,
settles it and leaves. An error stops the loop at once: the group settles nothing more,
gives back what no stage started, and leaves.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Protocol

from worker.config import WorkerConfig
from worker.loop.group import Group
from worker.loop.threads import StageThreads
from worker.ops import HealthState

__all__ = ["Background", "Worker"]

log = logging.getLogger(__name__)


class Background(Protocol):
    """Work on a thread of its own beside the worker's: started when it runs, stopped
    (within ``timeout``; True when it ended) when it closes."""

    def start(self) -> None: ...

    def stop(self, timeout: float) -> bool: ...


class Worker:
    """Runs pipelines for one member of a group. Not thread-safe except ``stop``."""

    def __init__(
        self,
        *,
        config: WorkerConfig,
        group: Group,
        threads: StageThreads,
        health: HealthState,
        abort: threading.Event,
        background: Sequence[Background] = (),
    ) -> None:
        """``group`` acquires and settles; ``threads`` run the batches it hands over.
        ``abort`` is shared with the pipelines: set when the worker fails or closes, so a
        batch waiting for the feature store gives up at once. ``background`` runs on
        threads of its own while ``run`` runs (the model reloader, shadow models, the
        group coverage check)."""
        self.config = config
        self.group = group
        self.health = health
        self._threads = threads
        self._abort = abort
        self._background = list(background)
        self._stop = threading.Event()

    # -- control -------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to finish; safe from signal handlers and other threads."""
        self.health.stopping = True
        self._stop.set()

    @property
    def stopping(self) -> bool:
        """``stop()`` was called."""
        return self._stop.is_set()

    def records_of(self, pipeline: str) -> int:
        """Records of ``pipeline`` this member holds unsettled."""
        return self.group.records_of(pipeline)

    def run(self, *, burst_idle_s: float | None = None) -> None:
        """Serve until ``stop()``; with ``burst_idle_s`` also stop after that long idle.

        Raises the ``StreamferError`` that stopped it; what was not settled is consumed
        again by whoever owns the partitions next (a consumer group), or released and
        delivered again by the broker (a share group).
        """
        self.group.join()
        for part in self._background:
            part.start()
        try:
            while not self._stop.is_set():
                self.run_once()
                if burst_idle_s is not None and self.group.idle_for(burst_idle_s):
                    log.info("burst: idle for %.1fs, stopping", burst_idle_s)
                    break
            self.group.drain()
        except BaseException as exc:
            self.group.failed(exc)
            self._abort.set()
            raise
        finally:
            self._close()

    # -- the loop ------------------------------------------------------------------------

    def run_once(self) -> None:
        """One turn of the loop thread: acquire, then settle. Raises the error of a
        processing stage, a failed delivery (SinkError) or a fatal client error."""
        self.check()
        self.group.acquire()
        self.group.settle(self)

    def check(self) -> None:
        """Beat the liveness clock; raise what stopped a stage or the client."""
        self.health.turned()
        self._threads.check()
        self.group.raise_fatal()

    # -- shutdown ------------------------------------------------------------------------

    def _close(self) -> None:
        self._abort.set()
        self.group.give_back()
        if not self._threads.close(5.0):
            log.warning("the processing thread did not finish")
        for part in self._background:  # after the stages: a shadow scores their last batches
            if not part.stop(5.0):
                log.warning("%s did not finish", type(part).__name__)
        self.group.leave()
