"""Network faults for the fault harness: what each one does, how long the group may take
to serve again after it, and how that time is measured.

Every byte between the workers and Kafka (and Redis) goes through toxiproxy
(``streamfer_dev.toxiproxy``); a fault is a set of toxics on one of its proxies, or the
proxy disabled (the server down, as the workers see it). This module holds no I/O of its
own beyond the proxy calls, so the definitions, the bounds and the measurement are unit
tested with fakes; ``benchmarks.chaos`` runs them against real workers.

Recovery is counted from the moment the fault is healed: the seconds until every
partition's committed offset has moved past where it stood then (or sits at the log end).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from streamfer_dev.toxiproxy import Toxic
from worker.config import KafkaSettings
from worker.kafka import CALL_TIMEOUT_S, STALL_MARGIN_S

__all__ = [
    "RESTART_S",
    "SETTLE_S",
    "NetFault",
    "Offsets",
    "Proxies",
    "apply",
    "heal",
    "net_faults",
    "recovery_bound_s",
    "served",
    "unmet",
    "wait_recovered",
]

Target = Literal["kafka", "redis"]

SETTLE_S = 6.0
"""After a fault, beyond a session timeout: librdkafka's reconnect backoff and one
rebalance round (two with the cooperative protocol, at a 1 s heartbeat each)."""

RESTART_S = 12.0
"""A worker the CallWatch stopped, started again (in place, after a 1 s backoff, or by a
supervisor): interpreter and model start-up,
``init_transactions`` (which fences the stuck producer) and the rejoin, on a busy
2-core machine."""

COVERAGE_S = 2 * KafkaSettings.model_fields["group_coverage_check_s"].default + 2.0
"""A static member stopped between its revoke and its rejoin leaves partitions unowned
after its restart: two coverage checks in a row (``worker.kafka.group_coverage``) and the
rejoin of the member that acts, about a second."""


@dataclass(frozen=True)
class NetFault:
    """One network fault on one proxy for ``duration_s``; no toxics: the proxy disabled."""

    name: str
    target: Target
    text: str
    duration_s: float
    toxics: tuple[Toxic, ...] = ()

    @property
    def cuts_kafka(self) -> bool:
        """Does it part the workers from the broker (so a transactional call may wedge)?"""
        return self.target == "kafka" and (
            not self.toxics or all(t.kind == "timeout" for t in self.toxics)
        )


def _both(name: str, kind: str, **attributes: int) -> tuple[Toxic, ...]:
    return tuple(
        Toxic(f"{name}-{stream}", kind, dict(attributes), stream)
        for stream in ("upstream", "downstream")
    )


def net_faults(session_timeout_s: float) -> dict[str, NetFault]:
    """The faults by name; the black hole lasts the session timeout plus 4 s, so every
    member's session expires inside it."""
    hole_s = session_timeout_s + 4
    faults = [
        NetFault(
            "latency",
            "kafka",
            "Kafka 300 ms (+-100 ms) slower each way, 10 s",
            10,
            _both("latency", "latency", latency=300, jitter=100),
        ),
        NetFault("broker-down", "kafka", "Kafka unreachable (proxy disabled), 15 s", 15),
        NetFault(
            "black-hole",
            "kafka",
            f"Kafka black hole (timeout toxic: bytes dropped, connections held), {hole_s:g} s",
            hole_s,
            _both("hole", "timeout", timeout=0),
        ),
        NetFault(
            "bandwidth",
            "kafka",
            "Kafka at 20 KB/s each way, 10 s",
            10,
            _both("bandwidth", "bandwidth", rate=20),
        ),
        NetFault(
            "sliced",
            "kafka",
            "Kafka bytes sliced into ~64 B packets 0.2 ms apart, 10 s",
            10,
            _both("slicer", "slicer", average_size=64, size_variation=32, delay=200),
        ),
        NetFault("redis-down", "redis", "Redis unreachable (proxy disabled), 10 s", 10),
        NetFault(
            "redis-reset",
            "redis",
            "Redis connections reset by peer as they open, 10 s",
            10,
            (Toxic("reset", "reset_peer", {"timeout": 0}, "upstream"),),
        ),
    ]
    return {f.name: f for f in faults}


def recovery_bound_s(fault: NetFault, *, exactly_once: bool, session_timeout_s: float) -> float:
    """How long after ``fault`` heals every partition must be served again.

    At-least-once, and exactly-once when the broker stays reachable: a session timeout
    (a member whose session expired meanwhile rejoins, and the group waits that long for
    members it still counts) plus ``SETTLE_S``. Exactly-once when the broker is cut off:
    a transactional call can wedge in librdkafka, and not only one begun during the
    fault: a member whose session expired rejoins as the fault heals, and its first
    ``send_offsets_to_transaction`` then can wedge too (seen in every such run). The
    CallWatch stops that worker ``CALL_TIMEOUT_S + STALL_MARGIN_S`` after the call began,
    and its start in place takes ``RESTART_S``; when that worker was stopped between revoking
    and rejoining, the group coverage check takes ``COVERAGE_S`` more to have the
    partitions it revoked assigned again."""
    plain = session_timeout_s + SETTLE_S
    if not (exactly_once and fault.cuts_kafka):
        return plain
    return max(plain, CALL_TIMEOUT_S + STALL_MARGIN_S + RESTART_S + COVERAGE_S)


class Proxies(Protocol):
    """What ``apply`` and ``heal`` need of a ``Toxiproxy``."""

    def set_enabled(self, proxy: str, enabled: bool) -> None: ...
    def add(self, proxy: str, toxic: Toxic) -> None: ...
    def remove(self, proxy: str, toxic: str) -> None: ...


def apply(proxies: Proxies, fault: NetFault) -> None:
    if not fault.toxics:
        proxies.set_enabled(fault.target, False)
    for toxic in fault.toxics:
        proxies.add(fault.target, toxic)


def heal(proxies: Proxies, fault: NetFault) -> None:
    if not fault.toxics:
        proxies.set_enabled(fault.target, True)
    for toxic in fault.toxics:
        proxies.remove(fault.target, toxic.name)


def served(
    baseline: Mapping[int, int], committed: Mapping[int, int], ends: Mapping[int, int]
) -> bool:
    """Has every partition committed past ``baseline`` (its offset when the fault
    healed), or caught up with its log end? An offset of -1 means none committed."""
    for p, end in ends.items():
        now = max(committed.get(p, -1), 0)
        if now < end and now <= max(baseline.get(p, -1), 0):
            return False
    return True


Offsets = Callable[[], tuple[dict[int, int], dict[int, int]]]
"""Returns (committed offsets, log ends) per partition."""


def wait_recovered(
    offsets: Offsets,
    timeout_s: float,
    *,
    every_s: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float | None:
    """Seconds from now until ``served``, sampled every ``every_s``; None past
    ``timeout_s``. Call it the moment the fault heals."""
    start = clock()
    baseline, _ = offsets()
    while True:
        committed, ends = offsets()
        elapsed = clock() - start
        if served(baseline, committed, ends):
            return round(elapsed, 1)
        if elapsed >= timeout_s:
            return None
        sleep(every_s)


def unmet(report: Mapping[str, Any], *, exactly_once: bool) -> list[str]:
    """The expectations a network-fault run missed: none lost, no valid request
    dead-lettered, no duplicate for a read_committed reader in exactly-once mode, no
    worker exit unless the harness restarts them (``harness_restarts``), every partition
    served again within the bound after each fault (``recoveries``: the
    fault's name, ``recovery_s`` and ``bound_s``)."""
    missed = []
    if report["lost"]:
        missed.append(f"{report['lost']} lost")
    if report["dead_letters"]:
        missed.append(f"{report['dead_letters']} valid requests dead-lettered")
    if exactly_once and report["duplicates"]:
        missed.append(f"{report['duplicates']} duplicates in exactly-once mode")
    if report.get("worker_exits") and not report.get("harness_restarts"):
        missed.append(f"workers exited by themselves: exit codes {report['worker_exits']}")
    for r in report["recoveries"]:
        if r["recovery_s"] is None or r["recovery_s"] > r["bound_s"]:
            took = "never" if r["recovery_s"] is None else f"after {r['recovery_s']} s"
            missed.append(f"{r['fault']}: served again {took}, bound {r['bound_s']:g} s")
    return missed
