"""A step that cannot go on yet, and when to try it again.

A batch whose pipeline's model is at fault waits for the model, but the processing
threads are shared by every pipeline: a stage that slept on it would stop the others.
So the step raises ``Parked`` instead; the stage (``worker.loop.threads``) sets the job
aside, serves other pipelines' jobs, and runs the same step again after ``after_s``.
The parked pipeline's later jobs wait behind it, which keeps each partition's order.
"""

from __future__ import annotations

__all__ = ["Parked"]


class Parked(Exception):
    """Raised by a step that cannot go on now: run it again after ``after_s`` seconds."""

    def __init__(self, why: str, after_s: float) -> None:
        super().__init__(why)
        self.after_s = max(0.0, after_s)
