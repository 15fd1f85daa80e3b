"""The worker's loop: the one ``Worker`` loop for both kinds of group, the ``Group`` seam
and its two kinds (``ConsumerGroup``: the micro-batcher, group membership and pausing;
``ShareGroup``: a share group's poll in flight), priority lanes and the processing
threads.

``BatchSteps`` and the lane wiring are read from ``stages`` and ``lane_wiring`` on first
use (``worker.core.lazy``): they import the pipeline (and with it numpy and redis), which
the ``Worker`` itself sees only through Protocols, so ``from worker import Worker`` does
not load it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.core import lazy_names
from worker.loop.batcher import Batcher
from worker.loop.consumer_events import ConsumerEvents, RetiredBatches
from worker.loop.consumer_group import ConsumerGroup, ConsumerParts
from worker.loop.group import Group
from worker.loop.membership import Membership
from worker.loop.metrics import LoopFamilies
from worker.loop.pausing import PausingManager, share_fetch_options
from worker.loop.share_events import ShareEvents
from worker.loop.share_group import ShareGroup, ShareParts
from worker.loop.share_poll import LockGate
from worker.loop.threads import StageThreads
from worker.loop.worker import Background, Worker

if TYPE_CHECKING:
    from worker.loop.lane_wiring import bind_lane_gauges, lane_threads, pipeline_shares
    from worker.loop.stages import BatchSteps

__all__ = [
    "Background",
    "BatchSteps",
    "Batcher",
    "ConsumerEvents",
    "ConsumerGroup",
    "ConsumerParts",
    "Group",
    "LockGate",
    "LoopFamilies",
    "Membership",
    "PausingManager",
    "RetiredBatches",
    "ShareEvents",
    "ShareGroup",
    "ShareParts",
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
