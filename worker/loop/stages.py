"""The processing stages of one batch, as ``StageThreads`` runs them.

Decode and enrich on the first thread, infer on the second, publish on the third, each
a step that returns the next, holding the value its stage handed on (``Enriched``, then
``Scored``; see ``worker.pipeline.values``). A batch a rewind made stale (exactly-once), or whose
record lock ran out (a share group), is skipped at the first and at the last step:
nothing of it is produced, and its tracker fails so it is never committed or accepted.
The delivery mode's ``BatchGate`` says which batches are stale.
"""

from __future__ import annotations

from collections.abc import Mapping

from worker.core import Job
from worker.delivery import BatchGate
from worker.kafka import Sink
from worker.loop.threads import Step
from worker.pipeline import Pipeline

__all__ = ["BatchSteps"]


class BatchSteps:
    """The first stage of a job, which returns the rest (``StageThreads``' start)."""

    def __init__(self, pipelines: Mapping[str, Pipeline], sink: Sink, gate: BatchGate) -> None:
        self._pipelines = pipelines
        self._sink = sink
        self._gate = gate

    def __call__(self, job: Job) -> Step | None:
        gate, sink = self._gate, self._sink
        if gate.stale(job):
            _skip(job)
            return None
        pipeline = self._pipelines[job.pipeline]
        enriched = pipeline.prepare(job.batch)

        def infer() -> Step | None:
            scored = pipeline.infer(enriched)

            def publish() -> None:
                if gate.stale(job):
                    _skip(job)
                else:
                    pipeline.publish(scored, sink, job.tracker)
                    gate.acknowledge()  # earlier batches' reports, off the loop thread

            return publish

        return infer


def _skip(job: Job) -> None:
    job.tracker.fail("skipped: stale (a rewind is pending, or its record lock ran out)")
    job.tracker.seal()
