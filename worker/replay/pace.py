"""How fast a replay goes and how it says so: a token-bucket rate limit (``--max-rate``
bounds the load a replay puts on Kafka and Redis beside live traffic) and the progress
line with its rate and ETA."""

from __future__ import annotations

import math
from typing import TextIO

from worker.core import Clock, monotonic_clock
from worker.errors import ConfigError
from worker.tools import ProgressLine

__all__ = ["Progress", "RateLimiter", "format_duration", "format_progress"]


class RateLimiter:
    """A token bucket: ``rate`` records per second, bursts of at most ``burst``."""

    def __init__(self, rate: float, burst: float | None = None, clock: Clock = monotonic_clock):
        if rate <= 0:
            raise ConfigError("--max-rate must be positive")
        self.rate = rate
        self.burst = max(1.0, burst if burst is not None else rate / 10.0)
        self._clock = clock
        self._tokens = self.burst
        self._last = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now

    def allowance(self, wanted: int) -> int:
        """How many of ``wanted`` records may be taken now (possibly 0)."""
        self._refill()
        return max(0, min(wanted, math.floor(self._tokens + 1e-9)))  # float dust

    def take(self, n: int) -> None:
        self._tokens -= n

    def wait_s(self) -> float:
        """Seconds until one record may be taken."""
        self._refill()
        return 0.0 if self._tokens + 1e-9 >= 1 else (1 - self._tokens) / self.rate


def format_duration(seconds: float | None) -> str:
    """``"42s"``, ``"3m05s"``, ``"2h07m"``; ``"?"`` when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def format_progress(done: int, total: int, elapsed_s: float, *, width: int = 24) -> str:
    """``[#####-----]  1,200/4,000  30.0%  812 rec/s  ETA 3s`` (rate and ETA of this run)."""
    frac = min(1.0, done / total) if total > 0 else 1.0
    filled = round(frac * width)
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    eta = (total - done) / rate if rate > 0 else (0.0 if done >= total else None)
    return (
        f"[{'#' * filled}{'-' * (width - filled)}] {done:,}/{total:,} {frac * 100:5.1f}% "
        f"{rate:,.0f} rec/s ETA {format_duration(eta)}"
    )


class Progress(ProgressLine):
    """The replay's progress line: done/total, share, rate and ETA."""

    def __init__(
        self,
        total: int,
        *,
        label: str,
        stream: TextIO | None = None,
        every_s: float | None = None,
        clock: Clock = monotonic_clock,
    ) -> None:
        self.total = total
        super().__init__(
            lambda done, elapsed: f"{label} {format_progress(done, self.total, elapsed)}",
            stream=stream,
            every_s=every_s,
            clock=clock,
        )
