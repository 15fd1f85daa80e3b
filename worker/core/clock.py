"""Time as the worker reads it: the one clock seam, so every wait and timer is testable.

Every part that waits, times or paces takes ``clock: Clock`` (``monotonic_clock`` in
production) and measures any wait that must end against a ``Deadline`` on it; a test
hands in a fake it advances by hand. A record's Kafka timestamp is wall time, so the
few parts that age a record by it take ``wall: Clock`` (``wall_clock``) as well, never
reading ``time.time()`` beside their clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Clock", "monotonic_clock", "wall_clock"]

Clock = Callable[[], float]
"""Seconds: from an arbitrary, monotonic origin (``monotonic_clock``), or since the
epoch (``wall_clock``)."""

monotonic_clock: Clock = time.monotonic
"""What every wait and timer reads."""

wall_clock: Clock = time.time
"""Seconds since the epoch: only to age a record by its Kafka timestamp."""
