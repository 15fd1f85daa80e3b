"""A progress line for long commands (``streamfer replay``, ``features load``).

On a terminal the line is redrawn in place with ``\\r``; elsewhere (a log file, a CI
job) one line is written every few seconds, so logs stay readable.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TextIO

from worker.core import Clock, monotonic_clock

__all__ = ["ProgressLine"]


class ProgressLine:
    """Writes ``describe(done, elapsed_s)`` to ``stream`` (stderr) at most every
    ``every_s`` seconds: 0.2 on a terminal, 5 otherwise."""

    def __init__(
        self,
        describe: Callable[[int, float], str],
        *,
        stream: TextIO | None = None,
        every_s: float | None = None,
        clock: Clock = monotonic_clock,
    ) -> None:
        self._describe = describe
        self._stream = stream if stream is not None else sys.stderr
        self._tty = self._stream.isatty()
        self._every = every_s if every_s is not None else (0.2 if self._tty else 5.0)
        self._clock = clock
        self._started = clock()
        self._next = self._started + self._every

    def update(self, done: int, *, force: bool = False) -> None:
        now = self._clock()
        if not force and now < self._next:
            return
        self._next = now + self._every
        line = self._describe(done, now - self._started)
        self._stream.write(f"\r{line}\x1b[K" if self._tty else line + "\n")
        self._stream.flush()

    def finish(self, done: int) -> None:
        self.update(done, force=True)
        if self._tty:
            self._stream.write("\n")
            self._stream.flush()
