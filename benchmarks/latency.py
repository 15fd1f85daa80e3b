"""``python -m benchmarks.latency``: the latency-throughput curve, rate step by rate step.

For each contender it steps a steady open-loop rate (250, 500, 1,000, 2,000, 4,000, ...
requests/s, ``--step-s`` seconds each, fresh topics and group per step) until its p99
passes ``--stop-p99-ms`` or it falls behind (fewer results per second than
``BEHIND_SHARE`` of the rate, or some never came). Each step reports p50, p99 and p99.9
(from the request's CreateTime to the reader's receipt of its result, both hops, after
``--warmup-s``), CPU seconds per 10,000
records, the p99 of every 5 s window of requests (a stall shows as one window far
above the others) and the backpressure pauses the worker logged. At the end it reports
each contender's highest rate with p99 within ``--slo-ms`` and writes the curve of p50
and p99 against rate as a PNG chart (matplotlib, the ``bench`` extra).

The contenders: ``streamfer`` (the default config), ``streamfer_latency`` (``batch.mode
= "adaptive"``, the latency setting), ``batch_loop`` (the competent hand-written loop)
and ``relay`` (each record re-produced the moment it arrives, linger 0: the two Kafka
hops alone, the floor). The measuring is ``benchmarks.run``'s (``measure_contender``:
the open-loop producer, the common result reader, CPU from /proc). With ``--pin`` (the
default on two or more CPUs) the broker, Redis, the producer and the reader run on CPU
0 and the contender alone on CPU 1.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from benchmarks.charts import latency_chart
from benchmarks.contenders import Launched
from benchmarks.disruptions import (
    DisruptionOptions,
    format_disruption,
    run_disruption,
    seeded_stack,
    stored_layout,
)
from benchmarks.measure import summarize
from benchmarks.models import ModelKind
from benchmarks.run import Measured, Options, job_on, measure_contender
from streamfer_dev.harness import percentile
from streamfer_dev.stack import KAFKA_VERSION, local_kafka

__all__ = [
    "CONTENDERS",
    "Step",
    "backpressure_pauses",
    "latency_figures",
    "main",
    "next_rates",
    "slo_rate",
    "stop_after",
    "tail_split",
    "window_p99s",
]

CONTENDERS = ("streamfer", "streamfer_latency", "batch_loop", "relay")
FIRST_RATES = (250, 500, 1000, 2000, 4000)
BEHIND_SHARE = 0.9
"""A step whose results per second stay under this share of the rate fell behind."""
WINDOW_S = 5.0
_PAUSE = re.compile(r"backpressure: \d+ records")


@dataclass(frozen=True)
class Step:
    """One contender at one rate."""

    rate: float
    rps: float
    p50_ms: float | None
    p99_ms: float | None
    p999_ms: float | None
    cpu_s_per_10k: float | None
    window_p99_ms: list[float | None]
    pauses: int
    lost: int
    duplicates: int
    tail_split_ms: tuple[float | None, float | None] = (None, None)
    """Of the requests at or above the p99, the median time until the contender produced
    the result (the first hop and its own work) and the median time after (its producer's
    linger and the second hop): which side the tail lives on."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "rps": self.rps,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "p999_ms": self.p999_ms,
            "cpu_s_per_10k": self.cpu_s_per_10k,
            "window_p99_ms": self.window_p99_ms,
            "pauses": self.pauses,
            "lost": self.lost,
            "duplicates": self.duplicates,
            "tail_split_ms": list(self.tail_split_ms),
        }


def next_rates(first: Sequence[int] = FIRST_RATES) -> Callable[[int], float]:
    """The rate of step ``i``: ``first``, then doubling."""

    def rate(i: int) -> float:
        if i < len(first):
            return float(first[i])
        return float(first[-1] * 2 ** (i - len(first) + 1))

    return rate


def latency_figures(latencies: Sequence[float]) -> tuple[float | None, ...]:
    """p50, p99 and p99.9 in milliseconds (None without latencies)."""
    if not latencies:
        return (None, None, None)
    return tuple(round(percentile(latencies, q), 2) for q in (50, 99, 99.9))


def tail_split(
    latencies: Sequence[float], produced: Sequence[float], q: float = 99.0
) -> tuple[float | None, float | None]:
    """Of the latencies at or above their ``q`` percentile, the median of the part until
    the result was produced and the median of the rest (``Step.tail_split_ms``)."""
    if not latencies:
        return (None, None)
    bound = percentile(latencies, q)
    tail = [(v, b) for v, b in zip(latencies, produced, strict=True) if v >= bound]
    before = round(percentile([b for _, b in tail], 50), 2)
    after = round(percentile([v - b for v, b in tail], 50), 2)
    return (before, after)


def window_p99s(
    latencies: Sequence[float], request_ts_ms: Sequence[int], width_s: float = WINDOW_S
) -> list[float | None]:
    """The p99 of each ``width_s`` window of requests, by request time, from the first;
    None for a window without requests."""
    if not latencies:
        return []
    start = min(request_ts_ms)
    width_ms = width_s * 1000.0
    windows: dict[int, list[float]] = {}
    for value, ts in zip(latencies, request_ts_ms, strict=True):
        windows.setdefault(int((ts - start) // width_ms), []).append(value)
    last = max(windows)
    return [round(percentile(windows[i], 99), 2) if i in windows else None for i in range(last + 1)]


def backpressure_pauses(log_text: str) -> int:
    """How often a worker's log says it paused its partitions for the in-flight bound."""
    return len(_PAUSE.findall(log_text))


def stop_after(step: Step, stop_p99_ms: float) -> bool:
    """Whether the curve ends at ``step``: p99 over ``stop_p99_ms``, results missing, or
    fewer results per second than ``BEHIND_SHARE`` of the rate."""
    if step.lost or step.p99_ms is None:
        return True
    return step.p99_ms > stop_p99_ms or step.rps < BEHIND_SHARE * step.rate


def slo_rate(steps: Sequence[Step], slo_ms: float) -> float | None:
    """The highest rate whose p99 is within ``slo_ms`` with nothing lost and no fall
    behind; None when no step is."""
    good = [
        s.rate
        for s in steps
        if s.p99_ms is not None
        and s.p99_ms <= slo_ms
        and not s.lost
        and s.rps >= BEHIND_SHARE * s.rate
    ]
    return max(good) if good else None


@dataclass(frozen=True)
class CurveOptions:
    model: ModelKind = "light"
    contenders: tuple[str, ...] = CONTENDERS
    step_s: float = 20.0
    warmup_s: float = 3.0
    max_steps: int = 8
    stop_p99_ms: float = 100.0
    slo_ms: float = 20.0
    partitions: int = 4
    layout: str = "hash"
    pin: bool = True
    request_linger_ms: float = 0.0
    out: Path | None = None


def run_curve(
    opts: CurveOptions, progress: Callable[[str], None] = lambda _m: None
) -> dict[str, Any]:
    """Every contender's curve on one stack; the report (and the chart, with ``out``)."""
    pinned = opts.pin and (os.cpu_count() or 1) >= 2
    if pinned:
        os.sched_setaffinity(0, {0})  # the broker, Redis, producer and reader inherit it
    curves: dict[str, list[Step]] = {}
    with contextlib.ExitStack() as stack:
        bootstrap = stack.enter_context(local_kafka())
        where, run_id, entities = seeded_stack(stack, bootstrap, opts.model, opts.layout)
        layout = stored_layout(opts.layout)
        tags = iter(range(1_000_000))
        on_launch = _pin_to_cpu1 if pinned else (lambda _l: None)

        def measure(name: str, rate: float, seconds: float) -> tuple[Measured, Options]:
            run_opts = Options(
                model=opts.model,
                mode="steady",
                rate=rate,
                records=max(1, int(rate * seconds)),
                partitions=opts.partitions,
                layout=layout,
                warmup_s=opts.warmup_s,
                request_linger_ms=opts.request_linger_ms,
                arrival=True,
            )
            job = job_on(where, f"{name}-{next(tags)}", run_opts)
            done = measure_contender(
                name, job, run_opts.records, entities, run_opts, run_id, on_launch
            )
            return done, run_opts

        progress("broker warm-up (relay, 1,000/s for 5 s)")
        measure("relay", 1000.0, 5.0)
        rate_of = next_rates()
        for name in opts.contenders:
            curves[name] = []
            for i in range(opts.max_steps):
                rate = rate_of(i)
                progress(f"{name} at {rate:.0f}/s")
                done, run_opts = measure(name, rate, opts.step_s)
                step = _step(done, run_opts)
                curves[name].append(step)
                progress(
                    f"  p50 {step.p50_ms} p99 {step.p99_ms} ms, {step.rps:.0f}/s, "
                    f"pauses {step.pauses}, lost {step.lost}"
                )
                if stop_after(step, opts.stop_p99_ms):
                    break
    report: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _git_head(),
        "broker": f"Apache Kafka {KAFKA_VERSION}"
        if not os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
        else "external Kafka",
        "model": opts.model,
        "layout": opts.layout,
        "step_s": opts.step_s,
        "warmup_s": opts.warmup_s,
        "pinned": pinned,
        "request_linger_ms": opts.request_linger_ms,
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "slo_ms": opts.slo_ms,
        "curves": {name: [s.as_dict() for s in steps] for name, steps in curves.items()},
        "slo_rate": {name: slo_rate(steps, opts.slo_ms) for name, steps in curves.items()},
    }
    if opts.out is not None:
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.with_suffix(".json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
        draw_chart(report, opts.out.with_suffix(".png"))
    return report


def _step(done: Measured, opts: Options) -> Step:
    reading = done.reading
    row = summarize(reading, backlog=False, rss_mb=done.rss_mb, warmup_s=opts.warmup_s or 0.0)
    start = (reading.first_request_ms or 0) + (opts.warmup_s or 0.0) * 1000.0
    kept = [
        (v, t, b)
        for v, t, b in zip(
            reading.latencies_ms, reading.request_ts_ms, reading.produced_ms, strict=True
        )
        if t >= start
    ]
    p50, p99, p999 = latency_figures([v for v, _, _ in kept])
    logs = "".join(p.read_text(errors="replace") for p in done.launched.logs if p.exists())
    return Step(
        rate=opts.rate,
        rps=row["rps"],
        p50_ms=p50,
        p99_ms=p99,
        p999_ms=p999,
        cpu_s_per_10k=row["cpu_s_per_10k"],
        window_p99_ms=window_p99s(reading.latencies_ms, reading.request_ts_ms),
        pauses=backpressure_pauses(logs),
        lost=row["lost"],
        duplicates=row["duplicates"],
        tail_split_ms=tail_split([v for v, _, _ in kept], [b for _, _, b in kept]),
    )


def _pin_to_cpu1(launched: Launched) -> None:
    """Every thread of the contender's processes onto CPU 1 (threads they start later
    inherit it)."""
    for pid in launched.pids():
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError, ValueError):
                    os.sched_setaffinity(int(task.name), {1})


def _git_head() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    return ""


def draw_chart(report: dict[str, Any], path: Path) -> None:
    """p50 (dashed) and p99 (solid) against rate, one colour per contender, log scales."""
    title = f"latency against rate: {report['date']}, commit {report['commit']}"
    with latency_chart(
        path, title, "requests/s (steady, open loop)", "request to result, ms"
    ) as ax:
        for i, (name, steps) in enumerate(report["curves"].items()):
            colour = f"C{i}"
            rates = [s["rate"] for s in steps]
            for key, style in (("p99_ms", "-"), ("p50_ms", "--")):
                values = [s[key] if s[key] is not None else float("nan") for s in steps]
                label = f"{name} {key.removesuffix('_ms')}"
                ax.plot(rates, values, style, color=colour, marker="o", label=label)
        ax.axhline(report["slo_ms"], color="grey", linewidth=0.8, linestyle=":")
        ax.set_xscale("log")


def format_curve(report: dict[str, Any]) -> str:
    """The report as a plain table, one row per step, then each contender's SLO rate."""
    lines = [
        "contender | rate/s | got/s | p50 ms | p99 ms | p99.9 ms | CPU s/10k | pauses | "
        "p99 per 5 s window ms | tail: to produce / after ms"
    ]
    for name, steps in report["curves"].items():
        for s in steps:
            windows = ", ".join("-" if w is None else f"{w:.0f}" for w in s["window_p99_ms"])
            lines.append(
                f"{name} | {s['rate']:.0f} | {s['rps']:.0f} | {s['p50_ms']} | {s['p99_ms']} | "
                f"{s['p999_ms']} | {s['cpu_s_per_10k']} | {s['pauses']} | {windows} | "
                f"{_pair(s.get('tail_split_ms'))}"
            )
    lines.append("")
    for name, rate in report["slo_rate"].items():
        shown = "none" if rate is None else f"{rate:.0f}/s"
        lines.append(f"{name}: highest rate with p99 <= {report['slo_ms']:.0f} ms: {shown}")
    return "\n".join(lines)


def _pair(split: Sequence[float | None] | None) -> str:
    """A tail split as ``before / after``; ``-`` where a report has none."""
    if not split or split[0] is None:
        return "-"
    return f"{split[0]} / {split[1]}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.latency",
        description="the latency-throughput curve of streamfer and its baselines",
    )
    parser.add_argument(
        "--model",
        choices=["light", "heavy"],
        default="light",
        help="the light random forest or the heavy MLP (default light)",
    )
    parser.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help=f"comma-separated subset of {','.join(CONTENDERS)} (default: all)",
    )
    parser.add_argument(
        "--step-s", type=float, default=20.0, help="seconds of requests per rate (default 20)"
    )
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=3.0,
        help="latency skips each step's requests of its first S seconds (default 3)",
    )
    parser.add_argument(
        "--max-steps", type=int, default=8, help="at most this many rates (default 8)"
    )
    parser.add_argument(
        "--stop-p99-ms",
        type=float,
        default=100.0,
        help="a contender's curve ends once its p99 passes this (default 100)",
    )
    parser.add_argument(
        "--slo-ms", type=float, default=20.0, help="the p99 the SLO rate is reported at"
    )
    parser.add_argument("--partitions", type=int, default=4, help="request topic partitions")
    parser.add_argument(
        "--layout",
        choices=["hash", "packed"],
        default="hash",
        help="features as Redis hashes or packed float32 vectors",
    )
    parser.add_argument(
        "--request-linger-ms",
        type=float,
        default=0.0,
        help="the request producer's linger.ms (default 0: each request sent at once)",
    )
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="leave CPU placement to the kernel (default: stack on CPU 0, contender on 1)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write the report to OUT.json and the chart to OUT.png",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--scenario",
        choices=["curve", "catch-up", "join"],
        default="curve",
        help="curve: step the rate; catch-up: stop the broker for --pause-s under a steady "
        "--rate; join: a second member joins under it (benchmarks.disruptions)",
    )
    parser.add_argument(
        "--runs", type=int, default=1, help="catch-up, join: runs per contender (default 1)"
    )
    parser.add_argument(
        "--rate", type=float, default=2000.0, help="catch-up: requests/s (default 2000)"
    )
    parser.add_argument(
        "--pause-s",
        type=float,
        default=5.0,
        help="catch-up: seconds the broker is stopped, 10 s into the run (default 5)",
    )
    parser.add_argument(
        "--consumer-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="catch-up, join: a librdkafka consumer setting for the streamfer workers, "
        "e.g. partition.assignment.strategy=roundrobin (repeatable)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    chosen = tuple(c.strip() for c in args.contenders.split(",") if c.strip())
    unknown = sorted(set(chosen) - set(CONTENDERS))
    if unknown:
        print(f"unknown contenders {unknown}; choose from {list(CONTENDERS)}", file=sys.stderr)
        return 2
    if any("=" not in o for o in args.consumer_option):
        print("--consumer-option takes KEY=VALUE", file=sys.stderr)
        return 2
    if args.scenario != "curve":
        return _disruption(args, chosen)
    if args.step_s <= args.warmup_s:
        print("--step-s must be longer than --warmup-s", file=sys.stderr)
        return 2
    opts = CurveOptions(
        model=args.model,
        contenders=chosen,
        step_s=args.step_s,
        warmup_s=args.warmup_s,
        max_steps=args.max_steps,
        stop_p99_ms=args.stop_p99_ms,
        slo_ms=args.slo_ms,
        partitions=args.partitions,
        layout=args.layout,
        pin=not args.no_pin,
        request_linger_ms=args.request_linger_ms,
        out=args.out,
    )

    def progress(message: str) -> None:
        print(f"latency: {message}", file=sys.stderr, flush=True)

    report = run_curve(opts, progress)
    print(orjson.dumps(report).decode() if args.json else format_curve(report))
    return 0


def _disruption(args: argparse.Namespace, chosen: tuple[str, ...]) -> int:
    """The catch-up or join scenario, pinned like the curve (without the relay)."""
    pinned = not args.no_pin and (os.cpu_count() or 1) >= 2
    if pinned:
        os.sched_setaffinity(0, {0})
    report = run_disruption(
        DisruptionOptions.from_args(args, tuple(c for c in chosen if c != "relay")),
        _pin_to_cpu1 if pinned else (lambda _l: None),
        lambda m: print(f"{args.scenario}: {m}", file=sys.stderr, flush=True),
    )
    print(orjson.dumps(report).decode() if args.json else format_disruption(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
