"""The one fake clock: monotonic time that moves only when the test moves it, or when the
code under test sleeps on it."""

from __future__ import annotations


class FakeClock:
    """Called, says ``now``; ``advance`` and ``sleep`` move it (a sleep is recorded)."""

    def __init__(self, start: float = 100.0) -> None:
        self.now = start
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, ms: float) -> None:
        self.now += ms / 1000.0

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
