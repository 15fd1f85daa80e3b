"""One time budget, for every wait of the worker that must end by a given moment.

A revoke, a drain, a transaction closing, the last commit: each waits for something,
doing a little work between looks, and must give up at its deadline. ``Deadline`` holds
the moment on an injected clock, and ``wait`` is the one loop they all run.
"""

from __future__ import annotations

from collections.abc import Callable

from worker.core.clock import Clock, monotonic_clock

__all__ = ["Deadline"]


class Deadline:
    """A moment on ``clock`` (seconds); it never moves."""

    __slots__ = ("_clock", "at")

    def __init__(self, at: float, clock: Clock = monotonic_clock) -> None:
        self.at = at
        self._clock = clock

    @classmethod
    def after(cls, seconds: float, clock: Clock = monotonic_clock) -> Deadline:
        return cls(clock() + seconds, clock)

    def remaining(self) -> float:
        """Seconds left, never below 0."""
        return max(0.0, self.at - self._clock())

    def passed(self) -> bool:
        return self._clock() >= self.at

    def wait(self, done: Callable[[], bool], step: Callable[[], object]) -> bool:
        """Run ``step`` until ``done()`` holds or the deadline passes; whether it holds.
        Blocks as long as ``step`` does between looks."""
        while not done():
            if self.passed():
                return False
            step()
        return True
