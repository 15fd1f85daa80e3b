"""Time as the worker reads it: an injected clock, so every wait is testable."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Clock", "monotonic_clock"]

Clock = Callable[[], float]
"""Seconds from an arbitrary, monotonic origin."""

monotonic_clock: Clock = time.monotonic
