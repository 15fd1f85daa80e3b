"""How a worker's pipelines are wired into priority lanes: the processing threads that
order batches by lane, the pipelines' shares of the in-flight bound, and the metrics
that show both.

``worker.loop.lanes`` and ``worker.loop.pausing`` hold the mechanisms; this module reads the
pipelines' ``priority`` and share settings once, at start-up, and binds every metric
child a lane reports to, so that nothing on the hot path looks a label up.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from worker.config import WorkerConfig
from worker.core import Job
from worker.loop.metrics import THREAD_STAGES, LoopFamilies
from worker.loop.pausing import Share
from worker.loop.threads import OnTake, StageThreads, Step
from worker.pipeline import Pipeline

__all__ = ["bind_lane_gauges", "lane_threads", "pipeline_shares"]


def lane_threads(
    start_job: Callable[[Job], Step | None],
    rank: dict[str, int],
    config: WorkerConfig,
    metrics: LoopFamilies,
) -> StageThreads:
    """The processing threads, one lane per priority (``rank``: pipeline -> its
    priority's rank; a plain FIFO when all share one)."""
    return StageThreads(
        start_job,
        lane=lambda job: rank[job.pipeline],
        top_lane=max(rank.values()) if len(set(rank.values())) > 1 else None,
        max_overtaken_s=config.max_overtaken_ms / 1000.0,
        on_take=_lane_metrics(metrics, list(rank)),
    )


def pipeline_shares(config: WorkerConfig, pipelines: Sequence[Pipeline]) -> list[Share]:
    """The pipelines' shares of the in-flight bound, in records."""
    bound = config.in_flight_bound
    shares = []
    for p in pipelines:
        share = config.in_flight_share(p.config)
        if share is not None:
            records, batch = int(share * bound), p.config.batch.max_batch_size
            shares.append(Share.of(p.name, p.config.request_topics, records, batch))
    return shares


def bind_lane_gauges(
    metrics: LoopFamilies,
    pipelines: Sequence[Pipeline],
    records_of: Callable[[str], int],
    shared: Sequence[str],
) -> None:
    """Each pipeline's priority and records in flight (``records_of``: those the group
    holds unsettled); 0 for "at its share" where it has one."""
    for p in pipelines:
        metrics.pipeline_priority.labels(p.name).set(p.config.rank)
        metrics.in_flight_records.labels(p.name).set_function(functools.partial(records_of, p.name))
        if p.name in shared:
            metrics.in_flight_share_held.labels(p.name).set(0)


def _lane_metrics(metrics: LoopFamilies, pipelines: Sequence[str]) -> OnTake:
    """What the processing threads report as they take a batch: its wait there, and
    whether aging took it ahead of a higher priority (children bound once here)."""
    wait = {
        (name, i): metrics.stage_wait_seconds.labels(name, stage).observe
        for name in pipelines
        for i, stage in enumerate(THREAD_STAGES)
    }
    aged = {
        (name, i): metrics.aged_batches.labels(name, stage).inc
        for name in pipelines
        for i, stage in enumerate(THREAD_STAGES)
    }

    def on_take(stage: int, job: Job, waited_s: float, was_aged: bool) -> None:
        wait[job.pipeline, stage](waited_s)
        if was_aged:
            aged[job.pipeline, stage]()

    return on_take
