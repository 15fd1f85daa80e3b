"""librdkafka's log lines and client errors, through Python logging, repeats held back.

Left alone, librdkafka writes to stderr in its own format, and an unreachable broker
makes it (and the error callback) repeat the same connection error every 50 ms. Every
client streamfer builds logs to ``KAFKA_LOG`` instead, so ``log_format = "json"``
applies to those lines too, and ``RepeatFilter`` lets one line of a kind through per
window, saying how many like it it held back.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable

__all__ = ["KAFKA_LOG", "RepeatFilter"]

_NUMBERS = re.compile(r"\d+")


class RepeatFilter(logging.Filter):
    """Passes the first record of a kind (its message with numbers blanked: ports,
    timings and ids vary between repeats) and then one per ``window_s``."""

    def __init__(self, window_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window_s = window_s
        self._clock = clock
        self._seen: dict[str, tuple[float, int]] = {}
        """kind -> (when one last went through, how many were held back since)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        kind = f"{record.levelno}:{_NUMBERS.sub('#', message)}"
        now = self._clock()
        seen = self._seen.get(kind)
        if seen is not None and now - seen[0] < self.window_s:
            self._seen[kind] = (seen[0], seen[1] + 1)
            return False
        if len(self._seen) > 1000:  # a flood of distinct lines: start counting afresh
            self._seen.clear()
        self._seen[kind] = (now, 0)
        if seen is not None and seen[1]:
            record.msg = f"{message} ({seen[1]} more like it in the last {now - seen[0]:.0f}s)"
            record.args = ()
        return True


KAFKA_LOG = logging.getLogger("streamfer.kafka")
"""Where every Kafka client of streamfer logs (its ``logger`` option) and reports errors."""
KAFKA_LOG.addFilter(RepeatFilter())
