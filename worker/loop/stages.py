"""The processing stages of one batch, as ``StageThreads`` runs them.

Decode and enrich on the first thread, infer on the second, publish on the third, each
a step that returns the next. A batch a rewind made stale (exactly-once) is skipped at
the first and at the last step: nothing of it is produced, and its tracker fails so it
is never committed.
"""

from __future__ import annotations

from worker.core.job import Job
from worker.delivery.mode import Delivery
from worker.kafka.sink import Sink
from worker.loop.threads import Step
from worker.pipeline.steps import Pipeline

__all__ = ["batch_steps"]


def batch_steps(job: Job, pipeline: Pipeline, sink: Sink, delivery: Delivery) -> Step | None:
    """Run the first stage of ``job`` and return the rest (``StageThreads`` calls it)."""
    if delivery.stale(job):
        _skip(job)
        return None
    prepared = pipeline.prepare(job.batch)

    def infer() -> Step | None:
        pipeline.infer(prepared)
        return publish

    def publish() -> None:
        if delivery.stale(job):
            _skip(job)
        else:
            pipeline.publish(prepared, sink, job.tracker)
            delivery.acknowledge()  # earlier batches' reports, off the loop thread

    return infer


def _skip(job: Job) -> None:
    job.tracker.fail("skipped: a rewind is pending")
    job.tracker.seal()
