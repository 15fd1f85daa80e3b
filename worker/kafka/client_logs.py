"""librdkafka's log lines and client errors, through Python logging, repeats held back.

Left alone, librdkafka writes to stderr in its own format, and an unreachable broker
makes it (and the error callback) repeat the same connection error every 50 ms. Every
client streamfer builds logs to ``KAFKA_LOG`` instead, so ``log_format = "json"``
applies to those lines too, and ``RepeatFilter`` lets one line of a kind through per
window, saying how many like it it held back.

A broker that restarts or dies is an event an operator expects in a cluster, not an
error per refused connection: ``BrokerOutages`` turns the first connection error about a
broker into one warning, holds back the rest (one reminder a minute while it lasts) and
says once when the client's statistics show the broker up again. Every other error,
about a broker or not (a refused login, a TLS handshake), stays an error.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from worker.core import Clock, monotonic_clock

__all__ = ["BROKER_OUTAGES", "KAFKA_LOG", "BrokerOutages", "RepeatFilter", "TransactionErrors"]

_NUMBERS = re.compile(r"\d+")

_BROKER = re.compile(r"(?:^|\s)(\S+?:\d+)(?:/\w+)?: ")
"""librdkafka's name of a broker, ``host:port/id`` (``/bootstrap`` before it knows the
id; ``GroupCoordinator: host:port`` for the coordinator's connection), where a message
about one connection starts."""

_ADDRESS = re.compile(r"ipv4#([\d.]+:\d+)|ipv6#(\[[0-9a-fA-F:.]+\]:\d+)")
"""The address librdkafka connects to (``Connect to ipv4#host:port failed``): the only
broker name in a line about the coordinator's connection before it knows the broker
(``GroupCoordinator: Connect to ...``)."""

_CONNECTION_LOST = (
    "Connection refused",
    "Disconnected",
    "onnection reset by peer",
    "connection closed by peer",
    "Connection timed out",
    "Broken pipe",
)
"""What librdkafka says when a broker's process or machine is gone; a refusal by a live
broker (authentication, TLS, a wrong protocol) says something else."""


class RepeatFilter(logging.Filter):
    """Passes the first record of a kind (its message with numbers blanked: ports,
    timings and ids vary between repeats) and then one per ``window_s``. DEBUG records
    all pass: librdkafka logs them only when its ``debug`` option is set, and whoever
    sets it wants the whole sequence, with each line's time."""

    def __init__(self, window_s: float = 30.0, clock: Clock = monotonic_clock) -> None:
        super().__init__()
        self.window_s = window_s
        self._clock = clock
        self._seen: dict[str, tuple[float, int]] = {}
        """kind -> (when one last went through, how many were held back since)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG:
            return True
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


class BrokerOutages(logging.Filter):
    """One warning per broker outage instead of an error per connection refused.

    ``filter`` sees every line of ``KAFKA_LOG``: the first connection error about a
    broker (keyed by ``host:port``, so its bootstrap and numbered names are one) passes
    as a WARNING saying so, later ones about it are held back, and every ``remind_s`` one
    more passes with how long and how many. ``seen`` takes librdkafka's statistics
    (``brokers``): a broker held as down that is ``UP`` there is logged as back, once.
    A broker no client needs any more is not reconnected to, so no statistics say it is
    back: an error after ``quiet_s`` without any about it starts a new outage.
    """

    def __init__(
        self,
        remind_s: float = 60.0,
        quiet_s: float = 30.0,
        clock: Clock = monotonic_clock,
    ) -> None:
        super().__init__()
        self.remind_s = remind_s
        self.quiet_s = quiet_s
        """Longer than librdkafka's longest reconnect backoff (10 s) while it still tries."""
        self._clock = clock
        self._down: dict[str, list[float]] = {}
        """host:port -> [when it went down, when a line last passed, lines held back,
        when the last error about it came]."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        message = record.getMessage()
        if not any(words in message for words in _CONNECTION_LOST):
            return True
        broker = _broker_of(message)
        if broker is None:
            return True
        now = self._clock()
        down = self._down.get(broker)
        if down is None or now - down[3] >= self.quiet_s:
            self._down[broker] = [now, now, 0, now]
            text = (
                f"Kafka broker {broker} is unreachable ({message}); its connection errors "
                "are held back until it is up again"
            )
        elif now - down[1] >= self.remind_s:
            text = (
                f"Kafka broker {broker} still unreachable after {now - down[0]:.0f}s "
                f"({int(down[2])} connection errors held back): {message}"
            )
            down[1:] = [now, 0, now]
        else:
            down[2:] = [down[2] + 1, now]
            return False
        record.msg, record.args = text, ()
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True

    def seen(self, brokers: Mapping[str, Mapping[str, Any]]) -> None:
        """librdkafka's per-broker statistics: each held as down and ``UP`` here is back."""
        if not self._down:
            return
        for name, stats in brokers.items():
            found = _BROKER.search(f"{name}: ")
            if found is None or stats.get("state") != "UP":
                continue
            down = self._down.pop(found.group(1), None)
            if down is not None:
                KAFKA_LOG.warning(
                    "Kafka broker %s is up again after %.0fs (%d connection errors held back)",
                    found.group(1),
                    self._clock() - down[0],
                    int(down[2]),
                )


_TRANSACTION_FACILITIES = frozenset({"TXNERR", "ADDOFFSETS"})
"""librdkafka's facilities for a transaction that failed and for offsets refused to one
(``send_offsets_to_transaction``)."""


class TransactionErrors(logging.Filter):
    """librdkafka's error lines about a failed transaction pass as warnings: the call that
    made the transaction gets the same error, and the worker logs it with what it does
    about it (an abort and a rewind, or a start again in place). Left as errors, every
    coordinator that moves in a cluster (an event an operator expects) logged one or two
    ``ERROR`` lines for a transaction the worker retried by itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if (
            record.levelno >= logging.ERROR
            and isinstance(args, tuple)
            and args
            and args[0] in _TRANSACTION_FACILITIES
        ):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def _broker_of(message: str) -> str | None:
    """``host:port`` of the broker a connection error is about, or None."""
    named = _BROKER.search(message)
    if named is not None:
        return named.group(1)
    address = _ADDRESS.search(message)
    return None if address is None else address.group(1) or address.group(2)


KAFKA_LOG = logging.getLogger("streamfer.kafka")
"""Where every Kafka client of streamfer logs (its ``logger`` option) and reports errors."""
BROKER_OUTAGES = BrokerOutages()
"""The outages ``KAFKA_LOG``'s lines and the consumers' statistics report."""
KAFKA_LOG.addFilter(BROKER_OUTAGES)
KAFKA_LOG.addFilter(TransactionErrors())
KAFKA_LOG.addFilter(RepeatFilter())
