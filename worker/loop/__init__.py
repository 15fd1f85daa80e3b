"""The worker's loop: the ``Worker``, the micro-batcher, group membership, pausing,
priority lanes and the processing threads; and the ``ShareWorker``, a share group's
loop around the same processing threads.

``BatchSteps`` and the lane wiring are read from ``stages`` and ``lane_wiring`` on first
use (``worker.core.lazy``): they import the pipeline (and with it numpy and redis), which
the ``Worker`` itself sees only through Protocols, so ``from worker import Worker`` does
not load it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.core import lazy_names
from worker.loop.batcher import Batcher
from worker.loop.consumer_events import ConsumerEvents, RetiredBatches
from worker.loop.membership import Membership
from worker.loop.metrics import LoopFamilies
from worker.loop.pausing import PausingManager, share_fetch_options
from worker.loop.share_events import ShareEvents
from worker.loop.share_poll import LockGate
from worker.loop.share_worker import ShareParts, ShareWorker
from worker.loop.threads import StageThreads
from worker.loop.worker import Background, LoopParts, Worker

if TYPE_CHECKING:
    from worker.loop.lane_wiring import bind_lane_gauges, lane_threads, pipeline_shares
    from worker.loop.stages import BatchSteps

__all__ = [
    "Background",
    "BatchSteps",
    "Batcher",
    "ConsumerEvents",
    "LockGate",
    "LoopFamilies",
    "LoopParts",
    "Membership",
    "PausingManager",
    "RetiredBatches",
    "ShareEvents",
    "ShareParts",
    "ShareWorker",
    "StageThreads",
    "Worker",
    "bind_lane_gauges",
    "lane_threads",
    "pipeline_shares",
    "share_fetch_options",
]

__getattr__ = lazy_names(
    __name__,
    {
        "BatchSteps": "stages",
        "bind_lane_gauges": "lane_wiring",
        "lane_threads": "lane_wiring",
        "pipeline_shares": "lane_wiring",
    },
)
