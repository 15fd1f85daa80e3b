"""``python -m benchmarks.lanes``: an interactive pipeline's latency beside a bulk backlog,
in one worker, with priority lanes and without.

One ``streamfer run`` serves two pipelines. ``bulk`` drains a backlog (``--backlog``
requests, written before the worker starts) on the heavy model (``benchmarks.models``:
the MLP, tens of milliseconds per 256-row batch, so the model thread is contended);
``live`` answers a steady open-loop stream (``--rate`` requests/s for ``--seconds``) on
the light model, with adaptive batches. ``lanes`` gives them ``priority = "interactive"``
and ``"bulk"`` (so bulk also holds at most ``bulk_in_flight_share`` of the in-flight
bound); ``fifo`` gives no priority, today's single first-in-first-out queue. Runs
alternate between the modes, each on fresh topics and a fresh group; an unmeasured
run with lanes warms the broker up first.

Per run: the interactive latency (result Kafka timestamp minus request produce
timestamp) of requests made while the backlog was draining (after the first
``--warmup-s`` seconds of the stream), p50/p95/p99/max; the bulk pipeline's records/s
from its first result to its last; lost and repeated results of both. On the local stack
(Apache Kafka from ``streamfer_dev.stack``, ``redis-server``) or ``KAFKA_BOOTSTRAP_SERVERS``
/ ``REDIS_URL``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import redis

from benchmarks.contenders import ROOT
from benchmarks.measure import Reading, read_results
from benchmarks.models import MODEL_NAMES, make_model
from benchmarks.producer import request_ids
from streamfer_dev.harness import (
    WorkerProcess,
    percentile,
    pipeline_toml,
    wait_for_assignment,
)
from streamfer_dev.modelgen import DemoModel, seed_entities
from streamfer_dev.stack import local_kafka, local_redis
from worker.kafka import ensure_topics

__all__ = ["Options", "main", "run_lanes"]

MODES = ("lanes", "fifo")
PARTITIONS = 4


@dataclass(frozen=True)
class Options:
    runs: int = 3
    """Measured runs per mode, alternating."""
    backlog: int = 60_000
    rate: float = 200.0
    seconds: float = 12.0
    warmup_s: float = 2.0
    bulk_batch: int = 256
    live_batch: int = 64
    live_wait_ms: float = 10.0
    modes: tuple[str, ...] = MODES
    max_in_flight: int | None = None
    """The worker's ``max_in_flight_batches`` (None: its default, 4)."""


@dataclass(frozen=True)
class Stack:
    bootstrap: str
    redis_url: str
    work: Path
    light: DemoModel
    heavy: DemoModel
    entity_prefix: str
    entities: int


def config_toml(stack: Stack, tag: str, mode: str, opts: Options) -> str:
    lanes = mode == "lanes"
    live = {"mode": "adaptive", "max_batch_size": opts.live_batch, "max_wait_ms": opts.live_wait_ms}
    bulk = {"max_batch_size": opts.bulk_batch, "max_wait_ms": 20}
    return (
        (f"max_in_flight_batches = {opts.max_in_flight}\n" if opts.max_in_flight else "")
        + f"""
[kafka]
bootstrap_servers = "{stack.bootstrap}"
group_id = "{tag}"
session_timeout_ms = 10000

[redis]
url = "{stack.redis_url}"
"""
        + _pipeline(stack, tag, "live", "interactive" if lanes else None, stack.light, live)
        + _pipeline(stack, tag, "bulk", "bulk" if lanes else None, stack.heavy, bulk)
    )


def _pipeline(
    stack: Stack,
    tag: str,
    name: str,
    priority: str | None,
    model: DemoModel,
    batch: dict[str, Any],
) -> str:
    return pipeline_toml(
        name=name,
        priority=priority,
        request_topic=f"{tag}-{name}-requests",
        result_topic=f"{tag}-{name}-results",
        dead_letter_topic=f"{tag}-{name}-dead-letters",
        model_path=model.path,
        model_name=MODEL_NAMES["light" if model is stack.light else "heavy"],
        fields=model.fields,
        batch=batch,
        source_headers=False,
    )


def _produce(stack: Stack, topic: str, n: int, rate: float) -> subprocess.Popen[bytes]:
    argv = [
        *(sys.executable, "-m", "benchmarks.producer", "--bootstrap", stack.bootstrap),
        *("--topic", topic, "--records", str(n), "--rate", str(rate)),
        *("--entity-prefix", stack.entity_prefix, "--entities", str(stack.entities)),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(argv, cwd=ROOT, env=env)


def run_once(stack: Stack, mode: str, opts: Options) -> dict[str, Any]:
    """One worker, one backlog, one interactive stream; the row of this run."""
    tag = f"lanes-{uuid.uuid4().hex[:8]}"
    topics = [f"{tag}-{p}-{kind}" for p in ("live", "bulk") for kind in ("requests", "results")]
    ensure_topics(stack.bootstrap, [(t, PARTITIONS) for t in topics])
    ensure_topics(stack.bootstrap, [(f"{tag}-{p}-dead-letters", 1) for p in ("live", "bulk")])
    backlog = _produce(stack, f"{tag}-bulk-requests", opts.backlog, 0.0)
    if backlog.wait(300) != 0:
        raise RuntimeError("the backlog producer failed")
    config = stack.work / f"{tag}.toml"
    config.write_text(config_toml(stack, tag, mode, opts))
    worker = WorkerProcess(config, stack.work / f"{tag}.log").start()
    live_n = int(opts.rate * opts.seconds)
    stream: subprocess.Popen[bytes] | None = None
    try:
        wait_for_assignment([worker], 2 * PARTITIONS, timeout=120)
        stream = _produce(stack, f"{tag}-live-requests", live_n, opts.rate)

        def pids() -> list[int]:
            return [worker.pid]

        bulk = read_results(
            stack.bootstrap,
            f"{tag}-bulk-results",
            set(request_ids(opts.backlog)),
            pids=pids,
            alive=worker.alive,
            deadline_s=900,
        )
        stream.wait(opts.seconds * 3 + 60)
        live = read_results(
            stack.bootstrap,
            f"{tag}-live-results",
            set(request_ids(live_n)),
            pids=pids,
            alive=worker.alive,
        )
    finally:
        if stream is not None and stream.poll() is None:
            stream.kill()
            stream.wait(10)
        code = worker.terminate()
    return _row(mode, bulk, live, code, opts)


def _row(mode: str, bulk: Reading, live: Reading, code: int, opts: Options) -> dict[str, Any]:
    drain_end = bulk.last_result_ms or 0
    start = (live.first_request_ms or 0) + opts.warmup_s * 1000.0
    during = [
        lat
        for lat, ts in zip(live.latencies_ms, live.request_ts_ms, strict=True)
        if start <= ts <= drain_end
    ]
    span_s = ((bulk.last_result_ms or 0) - (bulk.first_result_ms or 0)) / 1000.0
    return {
        "mode": mode,
        "live_during_drain": len(during),
        "p50_ms": _ms(percentile(during, 50)),
        "p95_ms": _ms(percentile(during, 95)),
        "p99_ms": _ms(percentile(during, 99)),
        "max_ms": _ms(max(during, default=float("nan"))),
        "bulk_rps": round(len(bulk.results) / span_s) if span_s > 0 else None,
        "lost": bulk.lost + live.lost,
        "duplicates": bulk.duplicates + live.duplicates,
        "exit_code": code,
        "timed_out": bulk.timed_out or live.timed_out,
    }


def _ms(value: float) -> float | None:
    return None if value != value else round(value, 1)


def run_lanes(opts: Options, progress: Callable[[str], None]) -> dict[str, Any]:
    """A warm-up run, then ``opts.runs`` runs per mode, alternating; the report."""
    load_before = os.getloadavg()[0]
    with contextlib.ExitStack() as stack:
        bootstrap = stack.enter_context(local_kafka())
        redis_url = stack.enter_context(local_redis())
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="streamfer-lanes-")))
        light, heavy = make_model("light", work), make_model("heavy", work)
        prefix = f"lanes-{uuid.uuid4().hex[:6]}-"
        client = redis.Redis.from_url(redis_url)
        entities = seed_entities(client, heavy, prefix=prefix)
        client.close()
        # the worker's config names keys features:{entity}; both models read the same rows
        env = Stack(bootstrap, redis_url, work, light, heavy, prefix, len(entities))
        progress("warm-up (lanes, not counted)")
        run_once(env, "lanes", opts)
        rows = []
        for i in range(opts.runs):
            for mode in opts.modes if i % 2 == 0 else tuple(reversed(opts.modes)):
                progress(f"run {i + 1}: {mode}")
                rows.append({"run": i + 1, **run_once(env, mode, opts)})
    summary = {
        mode: {
            key: statistics.median(r[key] for r in rows if r["mode"] == mode and r[key] is not None)
            for key in ("p50_ms", "p99_ms", "bulk_rps")
        }
        for mode in opts.modes
    }
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "options": opts.__dict__,
        "cpus": os.cpu_count(),
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "rows": rows,
        "median": summary,
    }


def format_report(report: dict[str, Any]) -> str:
    opts = report["options"]
    lines = [
        f"interactive {opts['rate']:g} req/s for {opts['seconds']:g} s beside a backlog of "
        f"{opts['backlog']:,} (heavy model, bulk batch {opts['bulk_batch']}, "
        f"max_in_flight_batches {opts['max_in_flight'] or 'default'}); "
        f"{report['date']}, load {report['loadavg_1m'][0]} -> {report['loadavg_1m'][1]}",
        "",
        "| run | mode | live p50 ms | p95 ms | p99 ms | max ms | bulk records/s | lost | dup |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['run']} | {r['mode']} | {r['p50_ms']} | {r['p95_ms']} | {r['p99_ms']} | "
            f"{r['max_ms']} | {r['bulk_rps']} | {r['lost']} | {r['duplicates']} |"
        )
    for mode, med in report["median"].items():
        lines.append(
            f"median {mode}: p50 {med['p50_ms']} ms, p99 {med['p99_ms']} ms, "
            f"bulk {med['bulk_rps']} records/s"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.lanes",
        description="interactive latency beside a bulk backlog, with priority lanes and without",
    )
    parser.add_argument("--runs", type=int, default=3, help="measured runs per mode")
    parser.add_argument("--backlog", type=int, default=60_000)
    parser.add_argument("--rate", type=float, default=200.0, help="interactive requests/s")
    parser.add_argument("--seconds", type=float, default=12.0, help="interactive stream length")
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--bulk-batch", type=int, default=256, help="bulk max_batch_size")
    parser.add_argument("--modes", default=",".join(MODES), help="lanes,fifo or one of them")
    parser.add_argument(
        "--max-in-flight", type=int, default=None, help="the worker's max_in_flight_batches"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if not modes or set(modes) - set(MODES) or args.runs < 1 or args.rate <= 0:
        print("need --runs >= 1, --rate > 0 and --modes from lanes,fifo", file=sys.stderr)
        return 2
    opts = Options(
        runs=args.runs,
        backlog=args.backlog,
        rate=args.rate,
        seconds=args.seconds,
        warmup_s=args.warmup_s,
        bulk_batch=args.bulk_batch,
        modes=modes,
        max_in_flight=args.max_in_flight,
    )
    report = run_lanes(opts, lambda m: print(f"lanes: {m} ...", file=sys.stderr, flush=True))
    print(orjson.dumps(report).decode() if args.json else format_report(report))
    failed = any(r["lost"] or r["duplicates"] or r["timed_out"] for r in report["rows"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
