"""A worker that starts itself again, in place, when a Kafka client of its is beyond use.

A transactional call that outlives its timeout (``worker.kafka.call_watch``) leaves its
producer stuck inside librdkafka: the call cannot be cancelled, and closing the client
would wait on the same call. A broker outage longer than ``transaction.timeout.ms``
leaves it fenced instead (the coordinator aborts the transaction and bumps the epoch:
``ProducerUnusable``), and a fenced producer is never usable again. A static member
(``group.instance.id``) whose session timed out, as when its group coordinator's broker
dies, is fenced by the group because librdkafka heartbeats without its member id
(``MemberFenced``), and a fenced consumer is as final. Rather than exit
and hope for an outside restart policy,
``streamfer run`` replaces its process image with a fresh one (``os.execve`` of the same
command line, same PID): every thread and socket of the old clients ends with the old
image, the new worker loads its models, its transactional producer (the same
``transactional.id`` under static membership) fences the stuck one and aborts the
transaction it left open, and its consumer starts from the committed offsets. The stuck
transaction never committed, so a read_committed reader sees nothing twice, and nothing
past the committed offsets is skipped: what a restart by the ``--processes`` supervisor
or Kubernetes guarantees, with neither.

The count travels to the new image in ``RECOVERY_ENV``; ``Recoveries`` publishes it as
``streamfer_recoveries_total{reason}`` and waits the supervisor's backoff
(``RestartPolicy``: 1 s doubling to 30 s while recoveries come within 60 s of a start)
before each one, so a cluster that wedges every call is retried slowly and loudly, never
in a silent loop.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client import CollectorRegistry, Counter

from worker.core import Clock, monotonic_clock
from worker.ops.supervisor import RestartPolicy

__all__ = ["RECOVERY_ENV", "RECOVERY_REASONS", "Recoveries", "RecoveryReason", "RecoveryRecord"]

log = logging.getLogger(__name__)

RECOVERY_ENV = "STREAMFER_RECOVERY"
"""Set by a worker for the image that replaces it: its recoveries so far."""

RecoveryReason = Literal["call_stalled", "producer_unusable", "member_fenced"]
RECOVERY_REASONS: tuple[RecoveryReason, ...] = (
    "call_stalled",
    "producer_unusable",
    "member_fenced",
)
"""``call_stalled``: a transactional call outlived its timeout plus a margin;
``producer_unusable``: the transactional producer was fenced or failed for good (an
outage past ``transaction.timeout.ms`` has the coordinator bump its epoch);
``member_fenced``: the group fenced the consumer as a static member, which librdkafka
brings on itself after a session timeout (``worker.errors.MemberFenced``)."""

_STEP_S = 0.1


@dataclass(frozen=True, slots=True)
class RecoveryRecord:
    """The recoveries of this worker so far, by reason, and how many of them came in a
    row sooner than ``RestartPolicy.healthy_after_s`` after a start (for the backoff)."""

    counts: Mapping[str, int] = field(default_factory=dict)
    quick: int = 0

    def encode(self) -> str:
        """``quick=1;call_stalled=2``: what ``parse`` reads back."""
        return ";".join(f"{k}={v}" for k, v in {"quick": self.quick, **self.counts}.items())

    @classmethod
    def parse(cls, text: str) -> RecoveryRecord:
        """What ``encode`` wrote; a field that is not a known name with a whole number is
        ignored, so a stray environment variable never stops a worker."""
        counts: dict[str, int] = {}
        quick = 0
        for item in text.split(";"):
            name, _, value = item.partition("=")
            if not value.isdigit():
                continue
            if name == "quick":
                quick = int(value)
            elif name in RECOVERY_REASONS:
                counts[name] = int(value)
        return cls(counts, quick)

    def after(self, reason: RecoveryReason, quick: int) -> RecoveryRecord:
        counts = dict(self.counts)
        counts[reason] = counts.get(reason, 0) + 1
        return RecoveryRecord(counts, quick)


class Recoveries:
    """This process's recoveries: the counter, restored from ``RECOVERY_ENV``, and
    ``restart``, which waits out the backoff and replaces the process image."""

    def __init__(
        self,
        environ: Mapping[str, str],
        registry: CollectorRegistry,
        *,
        policy: RestartPolicy | None = None,
        clock: Clock = monotonic_clock,
        sleep: Callable[[float], None] = time.sleep,
        execve: Callable[[str, list[str], dict[str, str]], object] = os.execve,
        argv: Sequence[str] | None = None,
    ) -> None:
        """``argv``: the command line to start again (default: this interpreter's own,
        ``sys.orig_argv``). ``execve`` only returns in tests."""
        self._environ = dict(environ)
        self.record = RecoveryRecord.parse(environ.get(RECOVERY_ENV, ""))
        self._policy = policy or RestartPolicy()
        self._clock = clock
        self._sleep = sleep
        self._execve = execve
        self._argv = list(argv if argv is not None else [sys.executable, *sys.orig_argv[1:]])
        self._started = clock()
        counter = Counter(
            "streamfer_recoveries",
            "Times this worker started itself again in place (same PID) to get back to "
            "serving by itself, by reason (call_stalled: a transactional Kafka call "
            "outlived its timeout; producer_unusable: the transactional producer was fenced "
            "or failed for good, as after an outage longer than transaction.timeout.ms; "
            "member_fenced: the group fenced the consumer as a static member, as librdkafka "
            "brings on itself after a session timeout); kept across those restarts",
            ["reason"],
            registry=registry,
        )
        for reason in RECOVERY_REASONS:
            counter.labels(reason).inc(self.record.counts.get(reason, 0))

    def delay_s(self) -> tuple[float, int]:
        """The backoff before a recovery now, and the count of quick ones to hand on."""
        return self._policy.after_exit(self.record.quick, self._clock() - self._started)

    def restart(self, reason: RecoveryReason, why: str, stopping: Callable[[], bool]) -> None:
        """Log one warning, wait the backoff (``/healthz`` still says why the worker is
        not live), then replace this process with a fresh start of the same command.
        Returns at once, logging nothing, when ``stopping()`` is already true (a signal:
        the caller exits instead), and later when it turned true meanwhile or the new
        image could not be started (logged)."""
        if stopping():
            return
        delay, quick = self.delay_s()
        record = self.record.after(reason, quick)
        log.warning(
            "recovering by itself (%s, recovery %d): %s; starting again in place in %.1fs, "
            "from the committed offsets",
            reason,
            sum(record.counts.values()),
            why,
            delay,
        )
        waited = 0.0
        while waited < delay:
            if stopping():
                return
            self._sleep(min(_STEP_S, delay - waited))
            waited += _STEP_S
        if stopping():
            return
        env = {**self._environ, RECOVERY_ENV: record.encode()}
        _flush_logs()
        # SIGHUP waits, pending, until the new image's handler unblocks it (as a
        # supervisor's child starts); left as it is it would end the new image.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
        try:
            self._execve(self._argv[0], self._argv, env)
        except OSError as exc:
            log.error("cannot start again in place (%s): %s", self._argv[0], exc)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _flush_logs() -> None:
    """What the old image logged reaches its file before the new one writes there."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
