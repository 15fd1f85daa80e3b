"""``python -m benchmarks.latency --scenario catch-up|join``: the latency around a
disruption of a steady rate, a broker stall or a member joining.

catch-up: the broker is stopped (SIGSTOP to its process group) for ``pause_s`` seconds,
``pause_at_s`` seconds into a steady open-loop run, and then let go on: meanwhile the
request producer keeps making requests (librdkafka holds them, each stamped with the
time it was made), so on resume the broker takes a burst of them at once and the
contender finds a backlog, as after any stretch where the broker's core was saturated.
For each contender it reports its steady p99 (requests before the stall, after the
warm-up), the time from the resume until the p99 of a 5 s window of requests is back
within ``RECOVERED_FACTOR`` times that, the time until the last request made before the
resume has its result, the drain rate over that time, and a chart of the p99 of each
second of requests around the event.

join: ``pause_at_s`` seconds into the run a second member of the contender (the same
program, config and group) starts, and the group rebalances under the steady rate; it
reports the p99 of the first 5 s of requests from the moment it started against the
steady p99 (and the same recovery time), ``runs`` times per contender.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import orjson
import redis

from benchmarks.charts import latency_chart
from benchmarks.contenders import Job, Launched, launch
from benchmarks.measure import Reading
from benchmarks.models import ModelKind, make_model
from benchmarks.run import Options, Stack, job_on, measure_contender
from streamfer_dev.harness import percentile
from streamfer_dev.modelgen import seed_entities
from streamfer_dev.stack import KAFKA_VERSION, local_redis, start_kafka

__all__ = [
    "DisruptionOptions",
    "format_disruption",
    "recovery",
    "run_disruption",
    "seeded_stack",
    "stored_layout",
]

RECOVERED_FACTOR = 2.0
"""A contender has caught up once a 5 s window's p99 is within this factor of its steady p99."""
WINDOW_MS = 5000.0


@dataclass(frozen=True)
class DisruptionOptions:
    scenario: str = "catch-up"
    """catch-up (the broker stopped for ``pause_s``) or join (a second member starts)."""
    runs: int = 1
    model: ModelKind = "light"
    contenders: tuple[str, ...] = ("streamfer", "streamfer_latency", "batch_loop")
    rate: float = 2000.0
    pause_at_s: float = 10.0
    pause_s: float = 5.0
    after_s: float = 20.0
    warmup_s: float = 3.0
    partitions: int = 4
    layout: str = "hash"
    out: Path | None = None
    consumer_options: tuple[tuple[str, str], ...] = ()
    """librdkafka settings for the streamfer workers (``--consumer-option``)."""

    @classmethod
    def from_args(cls, args: argparse.Namespace, contenders: tuple[str, ...]) -> DisruptionOptions:
        """From ``python -m benchmarks.latency``'s arguments."""
        return cls(
            scenario=args.scenario,
            runs=args.runs,
            model=args.model,
            contenders=contenders,
            rate=args.rate,
            pause_s=args.pause_s,
            warmup_s=args.warmup_s,
            partitions=args.partitions,
            layout=args.layout,
            out=args.out,
            consumer_options=tuple(
                (k, v) for k, v in (o.split("=", 1) for o in args.consumer_option)
            ),
        )


def recovery(
    latencies_ms: Sequence[float],
    request_ts_ms: Sequence[int],
    pause_start_ms: float,
    pause_end_ms: float,
    warmup_s: float,
) -> dict[str, Any]:
    """Steady p99 (requests after the warm-up, before the stall), the p99 of the first
    5 s of requests from the resume, seconds from the resume until a 5 s window of
    requests (sliding by 1 s from the resume) has its p99 within ``RECOVERED_FACTOR``
    of the steady one (None: never in the run), seconds until the last request made
    before the resume was answered, and results per second meanwhile."""
    first = min(request_ts_ms, default=0)
    steady = [
        v
        for v, t in zip(latencies_ms, request_ts_ms, strict=True)
        if first + warmup_s * 1000.0 <= t < pause_start_ms
    ]
    steady_p99 = percentile(steady, 99) if steady else None
    recovered_s: float | None = None
    last = max(request_ts_ms, default=0)
    start = pause_end_ms
    while steady_p99 is not None and start + WINDOW_MS <= last:
        window = [
            v
            for v, t in zip(latencies_ms, request_ts_ms, strict=True)
            if start <= t < start + WINDOW_MS
        ]
        if window and percentile(window, 99) <= RECOVERED_FACTOR * steady_p99:
            recovered_s = (start - pause_end_ms) / 1000.0
            break
        start += 1000.0
    first_window = [
        v
        for v, t in zip(latencies_ms, request_ts_ms, strict=True)
        if pause_end_ms <= t < pause_end_ms + WINDOW_MS
    ]
    arrivals = [t + v for v, t in zip(latencies_ms, request_ts_ms, strict=True)]
    backlog = [a for a, t in zip(arrivals, request_ts_ms, strict=True) if t < pause_end_ms]
    drained_at = max(backlog, default=pause_end_ms)
    drained_s = max(0.0, (drained_at - pause_end_ms) / 1000.0)
    answered = sum(1 for a in arrivals if pause_end_ms <= a <= drained_at)
    return {
        "steady_p99_ms": None if steady_p99 is None else round(steady_p99, 2),
        "first_5s_p99_ms": round(percentile(first_window, 99), 2) if first_window else None,
        "recovered_s": recovered_s,
        "drained_s": round(drained_s, 2),
        "drain_rps": round(answered / drained_s) if drained_s > 0 else None,
    }


def second_p99s(
    latencies_ms: Sequence[float], request_ts_ms: Sequence[int], origin_ms: float
) -> list[tuple[float, float]]:
    """The p99 of each second of requests: (seconds from ``origin_ms``, ms)."""
    seconds: dict[int, list[float]] = {}
    for v, t in zip(latencies_ms, request_ts_ms, strict=True):
        seconds.setdefault(int((t - origin_ms) // 1000.0), []).append(v)
    return [(float(s), round(percentile(seconds[s], 99), 2)) for s in sorted(seconds)]


class _TimedEvent:
    """Something done ``at_s`` after ``arm()``, on a timer thread; ``window_ms`` is when
    it began and ended (wall clock, like CreateTime), once it has."""

    def __init__(self, at_s: float) -> None:
        self._at_s = at_s
        self._timer: threading.Timer | None = None
        self.window_ms: tuple[float, float] | None = None

    def arm(self) -> None:
        """(Again) from now: the contender is ready and the producer starts."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = threading.Timer(self._at_s, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def wait(self) -> None:
        if self._timer is not None:
            self._timer.join()

    def stop(self) -> None:
        """Not to happen any more (the run failed first), and what it started stopped."""
        if self._timer is not None:
            self._timer.cancel()

    def _fire(self) -> None:
        raise NotImplementedError


class _BrokerStall(_TimedEvent):
    """Stops the broker's process group for ``pause_s``."""

    def __init__(self, pid: int, at_s: float, pause_s: float) -> None:
        super().__init__(at_s)
        self._pid, self._pause_s = pid, pause_s

    def _fire(self) -> None:
        started = time.time() * 1000.0
        os.killpg(self._pid, signal.SIGSTOP)
        try:
            time.sleep(self._pause_s)
        finally:
            os.killpg(self._pid, signal.SIGCONT)
        self.window_ms = (started, time.time() * 1000.0)


class _Join(_TimedEvent):
    """Starts a second member; ``stop()`` stops it."""

    def __init__(self, at_s: float, start: Callable[[], Launched]) -> None:
        super().__init__(at_s)
        self._start = start
        self.joiner: Launched | None = None

    def _fire(self) -> None:
        started = time.time() * 1000.0
        self.joiner = self._start()
        self.window_ms = (started, started)

    def stop(self) -> None:
        super().stop()
        if self.joiner is not None:
            self.joiner.stop()


def seeded_stack(
    stack: contextlib.ExitStack[Any], bootstrap: str, model_kind: ModelKind, layout: str
) -> tuple[Stack, str, int]:
    """Redis, a scratch folder and the model on ``stack``, its entities' features
    stored in ``layout``: where contenders run, the run's id and how many entities."""
    redis_url = stack.enter_context(local_redis())
    work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="streamfer-lat-")))
    run_id = uuid.uuid4().hex[:8]
    model = make_model(model_kind, work)
    client = redis.Redis.from_url(redis_url)
    entities = seed_entities(client, model, prefix=f"{run_id}-", layout=stored_layout(layout))
    client.close()
    return Stack(bootstrap, redis_url, work, model, f"lat-{run_id}"), run_id, len(entities)


def stored_layout(layout: str) -> Literal["hash", "packed"]:
    return "packed" if layout == "packed" else "hash"


def run_disruption(
    opts: DisruptionOptions,
    on_launch: Callable[[Launched], None] = lambda _l: None,
    progress: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """Every contender through the disruption ``opts.runs`` times, on one stack."""
    results: dict[str, list[dict[str, Any]]] = {}
    with contextlib.ExitStack() as stack:
        kafka = start_kafka()
        stack.callback(kafka.stop)
        where, run_id, entities = seeded_stack(stack, kafka.address, opts.model, opts.layout)
        layout = stored_layout(opts.layout)
        pause_s = opts.pause_s if opts.scenario == "catch-up" else 0.0
        run_opts = Options(
            model=opts.model,
            mode="steady",
            rate=opts.rate,
            records=int(opts.rate * (opts.pause_at_s + pause_s + opts.after_s)),
            partitions=opts.partitions,
            layout=layout,
            warmup_s=opts.warmup_s,
            request_linger_ms=0.0,
            arrival=True,
            consumer_options=opts.consumer_options,
        )
        tags = iter(range(1_000_000))
        for name in opts.contenders:
            results[name] = []
            for _ in range(opts.runs):
                progress(f"{name}: {opts.scenario} at {opts.rate:.0f}/s")
                job = job_on(where, f"{name}-{next(tags)}", run_opts)
                event = _event(opts, kafka.pid, name, job, on_launch)

                def launched(proc: Launched, event: _TimedEvent = event) -> None:
                    on_launch(proc)
                    event.arm()

                try:
                    done = measure_contender(
                        name, job, run_opts.records, entities, run_opts, run_id, launched
                    )
                    event.wait()
                finally:
                    event.stop()
                figures = _figures(name, done.reading, event.window_ms, opts.warmup_s)
                results[name].append(figures)
                progress(f"  {format_row(name, figures)}")
    report: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "broker": f"Apache Kafka {KAFKA_VERSION}",
        "scenario": opts.scenario,
        "rate": opts.rate,
        "pause_s": pause_s,
        "consumer_options": dict(opts.consumer_options),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "contenders": results,
    }
    if opts.out is not None:
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.with_suffix(".json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
        draw_disruption(report, opts.out.with_suffix(".png"))
    return report


def _event(
    opts: DisruptionOptions,
    broker_pid: int,
    name: str,
    job: Job,
    on_launch: Callable[[Launched], None],
) -> _TimedEvent:
    if opts.scenario == "catch-up":
        return _BrokerStall(broker_pid, opts.pause_at_s, opts.pause_s)
    joiner = replace(job, workdir=job.workdir / f"{job.group}-joiner")
    joiner.workdir.mkdir(parents=True, exist_ok=True)

    def start() -> Launched:
        second = launch(name, joiner)
        on_launch(second)
        return second

    return _Join(opts.pause_at_s, start)


def _figures(
    name: str, reading: Reading, window_ms: tuple[float, float] | None, warmup_s: float
) -> dict[str, Any]:
    if window_ms is None:
        raise RuntimeError(f"{name}: the run ended before the disruption")
    begin, end = window_ms
    figures = recovery(reading.latencies_ms, reading.request_ts_ms, begin, end, warmup_s)
    figures["lost"] = reading.lost
    figures["event_s"] = round((end - begin) / 1000.0, 2)
    figures["seconds"] = second_p99s(reading.latencies_ms, reading.request_ts_ms, end)
    return figures


def format_row(name: str, f: dict[str, Any]) -> str:
    recovered = "never" if f["recovered_s"] is None else f"{f['recovered_s']:.0f} s"
    return (
        f"{name} | {f['steady_p99_ms']} | {f['first_5s_p99_ms']} | {recovered} | "
        f"{f['drained_s']} s | {f['drain_rps']} | {f['lost']}"
    )


def format_disruption(report: dict[str, Any]) -> str:
    """One row per contender and run, side by side."""
    event = (
        f"broker stopped {report['pause_s']:.0f} s"
        if report["scenario"] == "catch-up"
        else "a second member joins"
    )
    given = ", ".join(f"{k}={v}" for k, v in report.get("consumer_options", {}).items())
    lines = [
        f"{event} at {report['rate']:.0f} requests/s; load average {report['loadavg_1m']}"
        + (f"; streamfer's consumer: {given}" if given else ""),
        "contender | steady p99 ms | first 5 s p99 ms | p99 back within 2x after | "
        "backlog answered after | drain results/s | lost",
    ]
    lines += [format_row(name, f) for name, runs in report["contenders"].items() for f in runs]
    return "\n".join(lines)


def draw_disruption(report: dict[str, Any], path: Path) -> None:
    """p99 of each second of requests against time from the event, log scale (each
    contender's first run)."""
    title = f"{report['scenario']} at {report['rate']:.0f}/s: {report['date']}"
    xlabel = "request time, s from the event's end"
    with latency_chart(path, title, xlabel, "p99 of that second's requests, ms") as ax:
        for i, (name, runs) in enumerate(report["contenders"].items()):
            seconds = runs[0]["seconds"]
            ax.plot(
                [s for s, _ in seconds],
                [v for _, v in seconds],
                color=f"C{i}",
                marker=".",
                label=name,
            )
        if report["pause_s"]:
            stalled = max(f["event_s"] for runs in report["contenders"].values() for f in runs)
            ax.axvspan(-stalled, 0.0, color="grey", alpha=0.2, label="broker stopped")
        else:
            ax.axvline(0.0, color="grey", linestyle=":", label="second member started")
