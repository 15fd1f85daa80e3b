"""Measuring a contender from outside: one result reader for all, and /proc counters.

``read_results`` consumes a result topic from the beginning and counts, by request id,
results and repeats; each result's latency is its Kafka timestamp minus the request's
produce timestamp, taken from the result's ``request_ts_ms`` (or, for the passthrough,
which forwards the request bytes unchanged, from its ``request_ts_ms`` header). It reads
the contender processes' CPU time (``/proc/<pid>/stat`` utime+stime, all threads) when the
first result arrives and when the last one does, so start-up (imports, model loading,
group join) is not charged per record. ``summarize`` turns that into the report's fields.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from streamfer_dev.harness import percentile

__all__ = ["Reading", "cpu_seconds", "peak_rss_mb", "read_results", "summarize"]

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU seconds of the processes (all their threads) so far."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat.rsplit(b")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime
    return total


def peak_rss_mb(pids: Sequence[int]) -> float | None:
    """The largest resident-set high-water mark (VmHWM) among the processes, in MiB."""
    peak: float | None = None
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        kb = int(line.split()[1])
                        peak = max(peak or 0.0, kb / 1024.0)
        except OSError:
            continue
    return peak


@dataclass
class Reading:
    """What the reader saw on one result topic."""

    expected: int
    results: Counter[str] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    request_ts_ms: list[int] = field(default_factory=list)
    """The request time of each latency, in the same order."""
    produced_ms: list[float] = field(default_factory=list)
    """Of each latency, in the same order, the part until the result's CreateTime (the
    moment the contender produced it; the rest is its linger and the second hop)."""
    first_request_ms: float | None = None
    newest_request_ms: float | None = None
    """The latest request time among the results read so far."""
    first_result_ms: float | None = None
    last_result_ms: float | None = None
    results_at_first: int = 0
    """Results already read when the first CPU sample was taken: at the first result, or
    with ``cpu_after_s`` at the first result of a request made that long after the first
    request."""
    cpu_first: float | None = None
    cpu_last: float | None = None
    results_at_last: int = 0
    timed_out: bool = False
    cached: int = 0
    """Results that say ``"cached": true`` (the output cache served them)."""

    @property
    def lost(self) -> int:
        return max(0, self.expected - len(self.results))

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.results.values() if n > 1)


def read_results(
    bootstrap: str,
    topic: str,
    expected_ids: set[str],
    *,
    pids: Callable[[], Sequence[int]],
    start_timeout_s: float = 90.0,
    idle_timeout_s: float = 15.0,
    deadline_s: float = 600.0,
    alive: Callable[[], bool] = lambda: True,
    on_first: Callable[[], None] | None = None,
    arrival: bool = False,
    cpu_after_s: float = 0.0,
    start: Callable[[], None] | None = None,
) -> Reading:
    """Read until every expected id has a result, or the contender stalls or dies.

    ``start_timeout_s`` bounds the wait for the first result, ``idle_timeout_s`` any gap
    after it, and ``deadline_s`` the whole read. ``pids`` names the processes whose CPU
    time is sampled, from the first result on, or with ``cpu_after_s`` from the first
    result of a request made that long after the first request (a steady run's CPU per
    record then leaves out the contender's start-up, the backlog its group join left and
    its first connections, as its latency percentiles do); ``on_first`` runs once, right
    after that first sample.
    With ``arrival`` a latency ends when the reader receives the result (it then takes
    each result as soon as it is fetched) rather than at the result's CreateTime, so the
    result producer's linger and the second hop count too. ``start`` starts the requests
    (a steady run) once the reader is assigned. The first fetch of a consumer just
    assigned a new, empty partition is held by the broker for the whole
    ``fetch.wait.max.ms`` even when records arrive meanwhile (with librdkafka's 500 ms,
    the first record after an assignment took 560-620 ms to be consumed, none once the
    consumer had been assigned 0.6 s): the reader's wait is 20 ms, and the request
    producer sends its first request ``benchmarks.producer.PRODUCER_ID_WAIT_S`` (0.6 s)
    after it connected, by when the contender, ready before the reader, is past its own.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-reader-{os.getpid()}-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 20,
        }
    )
    out = Reading(expected=len(expected_ids))
    pending = set(expected_ids)
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions])
        started = time.monotonic()
        last_seen = started
        if start is not None:
            start()
        while pending:
            now = time.monotonic()
            if now - started > deadline_s:
                out.timed_out = True
                break
            if out.first_result_ms is None:
                if now - started > start_timeout_s or not alive():
                    out.timed_out = True
                    break
            elif now - last_seen > idle_timeout_s or (now - last_seen > 2.0 and not alive()):
                out.timed_out = True
                break
            if arrival:
                first = consumer.poll(0.1)
                batch = [first, *consumer.consume(999, 0)] if first is not None else []
            else:
                batch = consumer.consume(1000, 0.1)
            if not batch:
                continue
            last_seen = time.monotonic()
            received_ms = time.time() * 1000.0 if arrival else None
            for msg in batch:
                if msg.error() is not None:
                    continue
                _count(out, msg, pending, received_ms)
            if out.cpu_first is None and out.results and _past(out, cpu_after_s):
                out.cpu_first = cpu_seconds(pids())
                out.results_at_first = sum(out.results.values())
                if on_first is not None:
                    on_first()
        out.cpu_last = cpu_seconds(pids())
        out.results_at_last = sum(out.results.values())
    finally:
        consumer.close()
    return out


def _past(out: Reading, seconds: float) -> bool:
    """Whether a result of a request made ``seconds`` after the first request was read."""
    if seconds <= 0:
        return True
    first, newest = out.first_request_ms, out.newest_request_ms
    return first is not None and newest is not None and newest >= first + seconds * 1000.0


def _count(out: Reading, msg: Any, pending: set[str], received_ms: float | None = None) -> None:
    doc = orjson.loads(msg.value())
    rid = doc["id"]
    request_ts = doc.get("request_ts_ms")
    if request_ts is None:
        request_ts = next((int(v) for k, v in msg.headers() or () if k == "request_ts_ms"), None)
    ts = msg.timestamp()[1]
    end = ts if received_ms is None else received_ms
    out.results[rid] += 1
    if doc.get("cached") is True:
        out.cached += 1
    pending.discard(rid)
    if request_ts is not None:
        out.latencies_ms.append(end - request_ts)
        out.request_ts_ms.append(request_ts)
        out.produced_ms.append(ts - request_ts)
        if out.first_request_ms is None or request_ts < out.first_request_ms:
            out.first_request_ms = request_ts
        if out.newest_request_ms is None or request_ts > out.newest_request_ms:
            out.newest_request_ms = request_ts
    if out.first_result_ms is None or ts < out.first_result_ms:
        out.first_result_ms = ts
    if out.last_result_ms is None or ts > out.last_result_ms:
        out.last_result_ms = ts


FIRST_SECONDS = 5.0
"""Steady mode: the first seconds of requests after the contender joined its group."""


def summarize(
    reading: Reading, *, backlog: bool, rss_mb: float | None, warmup_s: float = 0.0
) -> dict[str, Any]:
    """Throughput, latency percentiles, CPU per 10k records, RSS, lost and duplicates.

    Backlog throughput is distinct results over first-to-last result time (the contender
    starts after the backlog is written, so its start-up is excluded); steady throughput
    is over first request to last result, and ``first_5s_p99_ms`` is the p99 of the
    requests of the first 5 s (the contender had just joined). With ``warmup_s`` the
    latency percentiles skip
    requests made in the first that many seconds (a cold broker and client); throughput,
    lost and duplicates still count every record.
    """
    n = len(reading.results)
    first = reading.first_result_ms if backlog else reading.first_request_ms
    span_ms = (reading.last_result_ms or 0) - (first or 0)
    rps = n / (span_ms / 1000.0) if n > 1 and span_ms > 0 else 0.0
    cpu_per_10k: float | None = None
    counted = reading.results_at_last - reading.results_at_first
    if reading.cpu_first is not None and reading.cpu_last is not None and counted > 0:
        cpu_per_10k = (reading.cpu_last - reading.cpu_first) / counted * 10_000
    lat = reading.latencies_ms
    joined: float | None = None  # steady mode: the requests of a just-joined worker
    if not backlog and reading.first_request_ms is not None:
        end = reading.first_request_ms + FIRST_SECONDS * 1000.0
        early = [v for v, t in zip(lat, reading.request_ts_ms, strict=True) if t < end]
        joined = percentile(early, 99)
    if warmup_s > 0 and reading.first_request_ms is not None:
        start = reading.first_request_ms + warmup_s * 1000.0
        lat = [v for v, t in zip(lat, reading.request_ts_ms, strict=True) if t >= start]
    return {
        "records": reading.expected,
        "results": n,
        "rps": round(rps, 1),
        "p50_ms": _r(percentile(lat, 50)),
        "p95_ms": _r(percentile(lat, 95)),
        "p99_ms": _r(percentile(lat, 99)),
        "first_5s_p99_ms": _r(joined),
        "cpu_s_per_10k": _r(cpu_per_10k, 3),
        "rss_mb": _r(rss_mb, 1),
        "lost": reading.lost,
        "duplicates": reading.duplicates,
    }


def _r(value: float | None, digits: int = 2) -> float | None:
    if value is None or math.isnan(value):
        return None
    return round(value, digits)
