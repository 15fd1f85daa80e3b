"""Records the broker refuses for themselves, dead-lettered by the thread that serves
deliveries.

A result or dead letter the broker refuses as too large or invalid (``RECORD_ERRORS``)
is that record's fault, not the batch's: its request gets a dead letter instead, and a
record refused only for a batch-mate is sent again as it was. ``RefusedRecords`` makes
the trackers that queue such batches, and serves the queue whenever deliveries are
served; a batch is not done until that is handled. At-least-once (``AtLeastOnce`` in
``worker.delivery.mode``) and the share-group loop (``worker.loop.share_group``) both
deliver through it, on their loop thread.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Mapping
from typing import Protocol

from confluent_kafka import Message

from worker.core import Deadline, DeliveryTracker, Refusal
from worker.kafka import Sink

__all__ = ["RefusedRecords", "RefusingPipeline"]

log = logging.getLogger(__name__)


class RefusingPipeline(Protocol):
    """What serving refusals needs of a pipeline (``Pipeline``): the dead letter of a
    record the broker refused for itself."""

    def refusal_of(
        self, tracker: DeliveryTracker, produced: Message, why: str
    ) -> tuple[Message, Refusal] | str:
        """The request behind a refused record and its dead letter, or why there is none."""
        ...

    def dead_letter_undelivered(
        self, sink: Sink, tracker: DeliveryTracker, produced: Message, why: str
    ) -> None:
        """Dead-letter the request behind a record the broker refused for itself."""
        ...


class RefusedRecords:
    """Delivery trackers that queue their refused records, and the loop thread's serving
    of that queue (see the module docstring). Loop thread only, but for the trackers'
    own queueing, which takes the tracker's lock."""

    def __init__(self, sink: Sink, pipelines: Mapping[str, RefusingPipeline]) -> None:
        self._sink = sink
        self._pipelines = pipelines
        self._waiting: deque[DeliveryTracker] = deque()
        """Batches holding records the broker refused for themselves, to dead-letter."""

    def tracker(self, pipeline: str, oldest_ts_ms: int) -> DeliveryTracker:
        """The tracker of a new batch of ``pipeline``: its refusals queue here."""
        return DeliveryTracker(pipeline, oldest_ts_ms, self._waiting)

    def __len__(self) -> int:
        return len(self._waiting)

    def serve(self, timeout: float) -> None:
        """Serve delivery reports (up to ``timeout``), then dead-letter what was refused."""
        self._sink.poll(timeout)
        if self._waiting:
            self.dead_letter()

    def finish(self, deadline: Deadline, *, at_least_s: float) -> None:
        """Wait for every outstanding delivery, dead-lettering what the broker refuses on
        the way (those dead letters are deliveries too)."""
        sink = self._sink
        sink.flush(max(at_least_s, deadline.remaining()))

        def dead_letter() -> None:
            self.dead_letter()
            if self._waiting:
                time.sleep(0.005)  # a batch still being published: its thread seals it soon
            sink.flush(max(at_least_s, deadline.remaining()))

        deadline.wait(lambda: not self._waiting, dead_letter)

    def dead_letter(self) -> None:
        """Records the broker refused for themselves become their requests' dead letters;
        those refused only for a batch-mate are sent again, as they were. A batch still
        being published waits for the next turn: only then is this thread the one sending
        for it. Their reports may still arrive on a processing thread meanwhile:
        ``take_undelivered`` and the tracker's queueing share its lock."""
        waiting = self._waiting
        for _ in range(len(waiting)):
            tracker = waiting.popleft()
            if not tracker.sealed:
                waiting.append(tracker)
                continue
            pipeline = self._pipelines[tracker.pipeline]
            while (refused := tracker.take_undelivered()) is not None:
                produced, why = refused
                if why is None:  # refused only with a batch-mate: nothing wrong with it
                    self._sink.resend(tracker, produced)
                    continue
                log.warning(
                    "%s[%s] refused a record (%s): dead-lettering its request",
                    produced.topic(),
                    produced.partition(),
                    why,
                )
                pipeline.dead_letter_undelivered(self._sink, tracker, produced, why)
