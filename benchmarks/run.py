"""``python -m benchmarks.run``: streamfer against its baselines and ceilings, in one run.

On the local stack (Apache Kafka from ``streamfer_dev.stack.start_kafka`` and ``redis-server``, or
``KAFKA_BOOTSTRAP_SERVERS`` / ``REDIS_URL``) it makes the chosen model (``--model
light|heavy``), seeds Redis with one feature hash per data-set row, and measures, each on
fresh topics and a fresh consumer group: streamfer with one and with two worker
processes (two ``streamfer run``, and one ``streamfer run --processes 2``), the naive
per-record loop, the faust-streaming agent and the Kafka passthrough (all separate
processes), then ONNX Runtime alone and Redis pipelined HMGET alone (in process).
``--mode backlog`` writes all records before the contender starts and times the drain;
``--mode steady`` starts the contender, waits for its assignment, then produces open-loop
at ``--rate`` records/s. ``--repeat-share S --distinct D`` makes a share S of the requests
repeat D distinct inputs (``benchmarks.producer``), for ``streamfer_cache``, a worker with
the output cache on, beside ``streamfer`` without it. ``streamfer_share`` and
``streamfer_share_2w`` are one and two workers of a share group, for ``--partitions 1``.
It prints a table, or one JSON object with ``--json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import orjson
import redis

from benchmarks.ceilings import BATCH_SIZES, ort_alone, redis_alone
from benchmarks.contenders import KAFKA_CONTENDERS, ROOT, Job, Launched, Layout, launch
from benchmarks.measure import Reading, peak_rss_mb, read_results, summarize
from benchmarks.models import MODEL_NAMES, ModelKind, make_model
from benchmarks.producer import request_ids
from benchmarks.pyspy import Profiler, top_frames
from benchmarks.report import format_table, latency_targets, ratios
from benchmarks.rounds import median_row, round_orders, round_ratios
from streamfer_dev.modelgen import DemoModel, seed_entities
from streamfer_dev.stack import KAFKA_VERSION, local_kafka, local_redis
from streamfer_dev.triton import start_triton
from worker.config import BatchPolicy, FeatureSpec
from worker.kafka import ensure_topics

__all__ = [
    "ALL_CONTENDERS",
    "Measured",
    "Options",
    "Stack",
    "job_on",
    "main",
    "measure_contender",
    "run_benchmark",
]

ALL_CONTENDERS = (*KAFKA_CONTENDERS, "ort_alone", "redis_alone")
DEFAULT_CONTENDERS = tuple(
    c
    for c in ALL_CONTENDERS
    if c
    not in (
        "streamfer_baseline",
        "streamfer_cache",
        "streamfer_triton",
        "streamfer_triton_1",
        "streamfer_share",
        "streamfer_share_2w",
        "relay",
        "streamfer_latency",
    )
)
"""What runs without ``--contenders``: every contender but the cached worker, which only
says something about a stream that repeats itself (``--repeat-share``), and the share
groups' (``streamfer_share``, ``streamfer_share_2w``), which say something where a group
has fewer partitions than workers (``--partitions 1``), the earlier commit's, which
``--baseline-ref`` adds, the latency curve's own (``benchmarks.latency``), and the
worker whose model runs on a Triton server (``streamfer_triton``: the server, from
``streamfer_dev.triton``, serves the same model file on the same machine; the worker's CPU
is its own, the server's is not counted; ``streamfer_triton_1`` is that worker sending
a batch's calls one at a time, beside the default four in flight, which only differ
where ``--triton-max-batch-size`` splits a batch)."""
SLOW_CONTENDERS = ("naive", "faust")
ORT_CEILING_BUDGET_S = 2.0
"""How long ONNX Runtime alone is timed at the contenders' batch size."""
KAFKA_DEFAULT_REBALANCE_DELAY_MS = 3000
"""``group.initial.rebalance.delay.ms`` of the benchmark's broker: Kafka's default."""
MODEL_TEXT = {
    "light": "16-tree random forest (skl2onnx)",
    "heavy": "MLP 1024-1024-1024-512 (skl2onnx)",
}


@dataclass(frozen=True)
class Options:
    model: ModelKind = "light"
    mode: Literal["backlog", "steady"] = "backlog"
    records: int = 20_000
    rate: float = 2000.0
    cap: int = 2000
    contenders: tuple[str, ...] = DEFAULT_CONTENDERS
    partitions: int = 4
    max_batch_size: int = 256
    max_wait_ms: float = BatchPolicy().max_wait_ms
    py_spy: Path | None = None
    layout: Layout = "hash"
    batch_mode: Literal["fixed", "adaptive"] = "fixed"
    max_in_flight: int | None = None
    source_headers: bool = True
    warmup_s: float | None = None
    """Steady mode: latency counts requests after this many seconds (None: 3 s)."""
    consumer_options: tuple[tuple[str, str], ...] = ()
    broker_warmup: int = 20_000
    """Records a passthrough drains, unmeasured, before the first contender (0: none)."""
    repeat_share: float | None = None
    """Share of requests that repeat one of ``distinct`` inputs (None: entities only)."""
    distinct: int = 1000
    arrival: bool = False
    """Latency ends at the reader's receipt of a result, not at its CreateTime."""
    request_linger_ms: float | None = None
    """The request producer's ``linger.ms`` (None: the harness's 5 ms)."""
    triton_instances: int = 1
    """Instances of the Triton server's model (``streamfer_triton``)."""
    triton_max_batch_size: int | None = None
    """The Triton server's ``max_batch_size`` (None: ``max_batch_size``): below it, a
    worker's batch goes as several calls."""
    baseline_ref: str | None = None
    """A commit whose worker runs as ``streamfer_baseline`` beside today's (git archive of
    it into the run's folder): what a change cost, measured in the same run."""
    rounds: int = 1
    """How often the Kafka contenders run, their order reversed every other round
    (``benchmarks.rounds``)."""


def run_benchmark(
    opts: Options, progress: Callable[[str], None] = lambda _m: None
) -> dict[str, Any]:
    """Run every selected contender once; return the report."""
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    needs_kafka = any(c in KAFKA_CONTENDERS for c in opts.contenders)
    with contextlib.ExitStack() as stack:
        # Kafka's default delay, as on a production broker: the two workers of
        # streamfer_2w, started together, then share the group's first generation
        # instead of the second one joining (a rebalance) in the middle of the drain.
        kafka = local_kafka(initial_rebalance_delay_ms=KAFKA_DEFAULT_REBALANCE_DELAY_MS)
        bootstrap = stack.enter_context(kafka) if needs_kafka else ""
        redis_url = stack.enter_context(local_redis())
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="streamfer-bench-")))
        run_id = uuid.uuid4().hex[:8]
        baseline_root = None
        if "streamfer_baseline" in opts.contenders:
            if opts.baseline_ref is None:
                raise ValueError("the streamfer_baseline contender needs a baseline_ref")
            baseline_root = _source_tree(opts.baseline_ref, work / "baseline")
        model = make_model(opts.model, work)
        triton_url = None
        if any(c.startswith("streamfer_triton") for c in opts.contenders):
            progress("triton server")
            server = start_triton(
                [f"{MODEL_NAMES[opts.model]}:1:{model.path}"],
                max_batch_size=opts.triton_max_batch_size or opts.max_batch_size,
                instances=opts.triton_instances,
            )
            stack.callback(server.stop)
            triton_url = server.url
        client = redis.Redis.from_url(redis_url)
        entities = seed_entities(client, model, prefix=f"{run_id}-", layout=opts.layout)
        client.close()
        results: dict[str, dict[str, Any]] = {}
        extra: dict[str, Any] = {}
        profiles: dict[str, Any] = {}

        if "ort_alone" in opts.contenders:
            progress("ort_alone")
            # The ratio's batch size is timed for longer than the others (0.4 s samples
            # of the heavy model ranged 11,956-13,553 rows/s back to back, 2 s ones
            # 11,879-12,276), and once more after the Kafka contenders, below.
            nearest = min(BATCH_SIZES, key=lambda b: abs(b - opts.max_batch_size))
            others = [b for b in BATCH_SIZES if b != nearest]
            at = _time_ceiling(model.path, model.features, nearest)
            by_size = sorted(
                [*ort_alone(str(model.path), model.features, batch_sizes=others), at],
                key=lambda s: s["batch"],
            )
            results["ort_alone"] = {**_ceiling(at), "batch": at["batch"]}
            extra["ort_by_batch"] = by_size
        if "redis_alone" in opts.contenders:
            progress("redis_alone")
            spec = FeatureSpec(fields=model.fields, layout=opts.layout)
            batches = max(20, min(200, opts.records // opts.max_batch_size))
            fetched = redis_alone(
                redis_url, spec, entities, batch_size=opts.max_batch_size, batches=batches
            )
            results["redis_alone"] = {
                **_ceiling(fetched["fetch"]),
                "batch": fetched["fetch"]["batch"],
                "with_assemble_rps": fetched["assemble"]["rps"],
                "with_assemble_p50_ms": fetched["assemble"]["p50_ms"],
            }

        def job_for(name: str, tag: str) -> Job:
            where = Stack(bootstrap, redis_url, work, model, f"bench-{run_id}")
            job = job_on(where, tag, opts, baseline_root)
            if name.startswith("streamfer_triton"):
                job = replace(job, triton_url=triton_url)
            return job

        if needs_kafka and opts.broker_warmup > 0:
            # A fresh broker spends its first seconds of traffic loading and compiling
            # code; unwarmed, that cost (measured: a 1 s latency bump at 10,000/s, 10-20%
            # of backlog throughput) fell on whichever contender ran first: streamfer.
            progress("broker warm-up")
            warm = replace(opts, mode="backlog", py_spy=None)
            n = opts.broker_warmup
            row, _ = _run_kafka_contender(
                "passthrough",
                job_for("passthrough", "warmup"),
                n,
                len(entities),
                replace(warm, repeat_share=None),
                run_id,
            )
            extra["broker_warmup"] = {"records": n, "rps": row["rps"], "lost": row["lost"]}
            if row.get("error"):
                extra["broker_warmup"]["error"] = row["error"]

        names = [c for c in KAFKA_CONTENDERS if c in opts.contenders]
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        for r, order in enumerate(round_orders(names, opts.rounds)):
            for name in order:
                progress(name if opts.rounds == 1 else f"{name}, round {r + 1}/{opts.rounds}")
                slow = name in SLOW_CONTENDERS and opts.cap > 0
                n = min(opts.records, opts.cap) if slow else opts.records
                job = job_for(name, name if opts.rounds == 1 else f"{name}-r{r}")
                row, profile = _run_kafka_contender(name, job, n, len(entities), opts, run_id)
                if n < opts.records:
                    row["note"] = f"capped at {n} records"
                rounds[name].append(row)
                if profile:
                    profiles[name] = profile
        for name, rows in rounds.items():
            results[name] = median_row(rows)
        if opts.rounds > 1:
            extra["rounds"] = {
                "count": opts.rounds,
                "ratios": round_ratios(rounds, ratios),
                "rows": rounds,
            }

        if "ort_alone" in results and any(c in results for c in KAFKA_CONTENDERS):
            # This machine's speed drifts by 10-20% over minutes, and a 2 s timing once
            # fell to 7,896 rows/s between runs of 12,000-14,500. The ceiling is timed
            # again after the contenders and the faster timing counts, so a slow moment
            # never flatters streamfer's ratio.
            before = results["ort_alone"]
            after = _time_ceiling(model.path, model.features, int(before["batch"]))
            best = after if after["rps"] > before["rps"] else before
            results["ort_alone"] = {
                **_ceiling(best),
                "batch": before["batch"],
                "rps_before": before["rps"],
                "rps_after": after["rps"],
            }

    report: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "baseline": (
            _git("rev-parse", "--short", f"{opts.baseline_ref}^{{commit}}")
            if opts.baseline_ref
            else None
        ),
        "worktree_dirty": bool(_git("status", "--porcelain", "-uno", "--", "worker")),
        "broker": _broker_text(needs_kafka),
        "model": opts.model,
        "model_text": MODEL_TEXT[opts.model],
        "mode": opts.mode,
        "records": opts.records,
        "rate": opts.rate if opts.mode == "steady" else None,
        "partitions": opts.partitions,
        "max_batch_size": opts.max_batch_size,
        "max_wait_ms": opts.max_wait_ms,
        "layout": opts.layout,
        "batch_mode": opts.batch_mode,
        "max_in_flight_batches": opts.max_in_flight,
        "triton_instances": opts.triton_instances,
        "triton_max_batch_size": opts.triton_max_batch_size,
        "source_headers": opts.source_headers,
        "warmup_s": _warmup_s(opts),
        "consumer_options": dict(opts.consumer_options),
        "repeat_share": opts.repeat_share,
        "distinct": opts.distinct if opts.repeat_share is not None else None,
        "cpus": os.cpu_count(),
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "results": results,
        "ratios": ratios(results),
        "latency_targets": (
            latency_targets(results, extra.get("ort_by_batch", []), opts.max_wait_ms)
            if opts.mode == "steady"
            else None
        ),
        **extra,
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    if profiles:
        report["profiles"] = profiles
    return report


def _broker_text(used: bool) -> str:
    if not used:
        return "no broker"
    return (
        "external Kafka"
        if os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
        else f"Apache Kafka {KAFKA_VERSION}"
    )


def _time_ceiling(path: Path, features: Any, batch: int) -> dict[str, float]:
    return ort_alone(
        str(path), features, batch_sizes=[batch], budget_s=ORT_CEILING_BUDGET_S, max_calls=20_000
    )[0]


def _ceiling(stats: dict[str, float]) -> dict[str, Any]:
    return {
        "rps": stats["rps"],
        "p50_ms": stats["p50_ms"],
        "p95_ms": stats["p95_ms"],
        "p99_ms": stats["p99_ms"],
        "lost": 0,
    }


@dataclass(frozen=True)
class Stack:
    """Where a run's contenders work: the broker, Redis, the run's folder and model, and
    the prefix of its topic and group names."""

    bootstrap: str
    redis_url: str
    workdir: Path
    model: DemoModel
    prefix: str


def job_on(stack: Stack, tag: str, opts: Options, baseline_root: Path | None = None) -> Job:
    """A contender's job on fresh topics and a fresh group named by ``tag``."""
    name = f"{stack.prefix}-{tag}"
    return Job(
        bootstrap=stack.bootstrap,
        redis_url=stack.redis_url,
        request_topic=f"{name}-requests",
        result_topic=f"{name}-results",
        dead_letter_topic=f"{name}-dead-letters",
        group=name,
        model_path=stack.model.path,
        model_name=MODEL_NAMES[opts.model],
        fields=stack.model.fields,
        workdir=stack.workdir,
        max_batch_size=opts.max_batch_size,
        max_wait_ms=opts.max_wait_ms,
        consumer_options=dict(opts.consumer_options),
        layout=opts.layout,
        batch_mode=opts.batch_mode,
        max_in_flight=opts.max_in_flight,
        source_headers=opts.source_headers,
        baseline_root=baseline_root,
    )


@dataclass(frozen=True)
class Measured:
    """One contender's run: what the reader saw, its peak RSS, its processes (stopped;
    their logs stay in the run's folder) and py-spy's top frames."""

    reading: Reading
    rss_mb: float | None
    launched: Launched
    profile: dict[str, Any]


def _run_kafka_contender(
    name: str, job: Job, n: int, n_entities: int, opts: Options, run_id: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    done = measure_contender(name, job, n, n_entities, opts, run_id)
    reading, launched = done.reading, done.launched
    row = summarize(
        reading, backlog=opts.mode == "backlog", rss_mb=done.rss_mb, warmup_s=_warmup_s(opts)
    )
    if name in ("streamfer_2w", "streamfer_share_2w"):
        row["workers"] = 2
    if name.startswith("streamfer_share"):
        row["share_group"] = True
    if name == "streamfer_2p":
        row["processes"] = 2
    if reading.cached:
        row["cached"] = reading.cached
    if reading.timed_out:
        row["error"] = "stalled or exited before every result arrived"
        row["log_tail"] = launched.log_tail()
    return row, done.profile


def measure_contender(
    name: str,
    job: Job,
    n: int,
    n_entities: int,
    opts: Options,
    run_id: str,
    on_launch: Callable[[Launched], None] = lambda _l: None,
) -> Measured:
    """Run one contender on fresh topics: backlog (all ``n`` requests first) or steady
    (``opts.rate`` requests/s once it owns every partition); ``on_launch`` sees its
    processes as soon as they start (to pin them to a CPU, say)."""
    ensure_topics(
        job.bootstrap,
        [
            (job.request_topic, opts.partitions),
            (job.result_topic, opts.partitions),
            (job.dead_letter_topic, 1),
        ],
    )
    backlog = opts.mode == "backlog"
    producer_argv = [
        sys.executable,
        "-m",
        "benchmarks.producer",
        *("--bootstrap", job.bootstrap, "--topic", job.request_topic),
        *("--records", str(n), "--rate", "0" if backlog else str(opts.rate)),
        *("--entity-prefix", f"{run_id}-", "--entities", str(n_entities)),
    ]
    if opts.request_linger_ms is not None:
        producer_argv += ["--linger-ms", str(opts.request_linger_ms)]
    if opts.repeat_share is not None:
        producer_argv += [
            "--repeat-share",
            str(opts.repeat_share),
            "--distinct",
            str(opts.distinct),
        ]
        producer_argv += ["--feature", job.fields[0]]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    producers: list[subprocess.Popen[bytes]] = []
    profiler = Profiler(opts.py_spy) if opts.py_spy is not None else None
    launched: Launched | None = None
    try:
        if backlog:
            subprocess.run(producer_argv, cwd=ROOT, env=env, check=True, timeout=300)
            launched = launch(name, job)
            on_launch(launched)
        else:
            launched = launch(name, job)
            on_launch(launched)
            launched.wait_ready(opts.partitions, timeout=120)
            on_launch(launched)  # and the threads it started meanwhile
        procs = launched

        def start_requests() -> None:
            producers.append(subprocess.Popen(producer_argv, cwd=ROOT, env=env))

        def on_first() -> None:
            if profiler is not None:
                profiler.attach(name, procs.pids())

        reading = read_results(
            job.bootstrap,
            job.result_topic,
            set(request_ids(n)),
            pids=procs.pids,
            alive=procs.alive,
            on_first=on_first,
            arrival=opts.arrival,
            cpu_after_s=_warmup_s(opts),
            start=None if backlog else start_requests,
        )
        rss = peak_rss_mb(procs.pids())
    finally:
        spied = profiler.stop() if profiler is not None else []
        if launched is not None:
            launched.stop()
        for producer in producers:
            _reap(producer)
    profile = {path.stem: top_frames(path) for path in spied}
    return Measured(reading, rss, launched, profile)


def _warmup_s(opts: Options) -> float:
    if opts.mode == "backlog":
        return 0.0
    return 3.0 if opts.warmup_s is None else opts.warmup_s


def _reap(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _source_tree(ref: str, into: Path) -> Path:
    """The files of commit ``ref`` (``git archive``), unpacked into ``into``."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", "--format=tar", ref], cwd=ROOT, capture_output=True, timeout=120
    )
    if archive.returncode != 0:
        raise ValueError(f"--baseline-ref {ref}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True, timeout=120)
    return into


def _git(*args: str) -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=10
        )
        return done.stdout.strip()
    return ""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description="streamfer against a naive loop, faust-streaming and the ceilings",
    )
    parser.add_argument("--model", choices=["light", "heavy"], default="light")
    parser.add_argument("--mode", choices=["backlog", "steady"], default="backlog")
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument(
        "--rate", type=float, default=2000.0, help="records/s in steady mode (default 2000)"
    )
    parser.add_argument(
        "--cap",
        type=int,
        default=2000,
        help="at most this many records for the slow contenders (naive, faust); 0 = no cap",
    )
    parser.add_argument(
        "--contenders",
        default=",".join(DEFAULT_CONTENDERS),
        help=f"comma-separated subset of {','.join(ALL_CONTENDERS)} (default: all but "
        "streamfer_cache)",
    )
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--max-batch-size", type=int, default=256)
    parser.add_argument("--max-wait-ms", type=float, default=BatchPolicy().max_wait_ms)
    parser.add_argument(
        "--triton-instances",
        type=int,
        default=1,
        help="instances of the Triton server's model (streamfer_triton; default 1)",
    )
    parser.add_argument(
        "--triton-max-batch-size",
        type=int,
        default=None,
        help="the Triton server's max_batch_size (default: --max-batch-size); below it a "
        "batch goes as several calls",
    )
    parser.add_argument(
        "--layout",
        choices=["hash", "packed"],
        default="hash",
        help="features as Redis hashes (HMGET) or packed float32 vectors (GET/MGET)",
    )
    parser.add_argument(
        "--batch-mode",
        choices=["fixed", "adaptive"],
        default="fixed",
        help="streamfer's batch.mode",
    )
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=None,
        metavar="N",
        help="streamfer's max_in_flight_batches (default: the worker's own)",
    )
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=None,
        metavar="S",
        help="steady mode: latency percentiles and CPU per record skip requests of the "
        "first S seconds, for every contender (default 3; records still count for "
        "throughput and loss)",
    )
    parser.add_argument(
        "--no-source-headers",
        action="store_true",
        help="streamfer results without provenance headers (source_headers = false), "
        "like the other contenders' results",
    )
    parser.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        metavar="DIR",
        help="sample each contender process with py-spy while it drains; raw stacks in DIR",
    )
    parser.add_argument(
        "--consumer-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a librdkafka consumer setting for the streamfer workers (repeatable)",
    )
    parser.add_argument(
        "--broker-warmup",
        type=int,
        default=20_000,
        metavar="N",
        help="records a Kafka passthrough drains, unmeasured, before the first contender, "
        "so no contender pays for a cold broker (default 20000; 0 = none)",
    )
    parser.add_argument(
        "--repeat-share",
        type=float,
        default=None,
        metavar="S",
        help="a share S (0-1) of the requests repeat one of --distinct inputs, the rest are "
        "new ones (each request carries one feature inline); default: entities only",
    )
    parser.add_argument(
        "--distinct",
        type=int,
        default=1000,
        metavar="N",
        help="with --repeat-share: how many distinct inputs the repeats use (default 1000)",
    )
    parser.add_argument(
        "--baseline-ref",
        help="also run the worker of this commit (streamfer_baseline), on the same config",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="N",
        help="run the Kafka contenders N times, their order reversed every other round; "
        "rows are medians, ratios are given round by round (default 1)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


@contextlib.contextmanager
def _quiet_stdout(enabled: bool) -> Iterator[None]:
    """Keep stray library prints off stdout while --json owns it."""
    if not enabled:
        yield
        return
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    chosen = tuple(c.strip() for c in args.contenders.split(",") if c.strip())
    unknown = sorted(set(chosen) - set(ALL_CONTENDERS))
    if unknown:
        print(f"unknown contenders {unknown}; choose from {list(ALL_CONTENDERS)}", file=sys.stderr)
        return 2
    if args.mode == "steady" and args.rate <= 0:
        print("--mode steady needs --rate > 0", file=sys.stderr)
        return 2
    if args.py_spy is not None and not Profiler.available():
        print("--py-spy needs the py-spy binary: pip install py-spy", file=sys.stderr)
        return 2
    if args.repeat_share is not None and not 0 <= args.repeat_share <= 1:
        print("--repeat-share takes a share from 0 to 1", file=sys.stderr)
        return 2
    if args.distinct < 1:
        print("--distinct must be at least 1", file=sys.stderr)
        return 2
    if args.rounds < 1:
        print("--rounds must be at least 1", file=sys.stderr)
        return 2
    pairs = [o.split("=", 1) for o in args.consumer_option]
    if any(len(p) != 2 for p in pairs):
        print("--consumer-option takes KEY=VALUE", file=sys.stderr)
        return 2
    opts = Options(
        model=args.model,
        mode=args.mode,
        records=args.records,
        rate=args.rate,
        cap=args.cap,
        contenders=tuple(
            c
            for c in ALL_CONTENDERS
            if c in chosen or (c == "streamfer_baseline" and args.baseline_ref)
        ),
        partitions=args.partitions,
        max_batch_size=args.max_batch_size,
        max_wait_ms=args.max_wait_ms,
        py_spy=args.py_spy,
        layout=args.layout,
        batch_mode=args.batch_mode,
        max_in_flight=args.max_in_flight,
        source_headers=not args.no_source_headers,
        warmup_s=args.warmup_s,
        consumer_options=tuple((k, v) for k, v in pairs),
        broker_warmup=max(0, args.broker_warmup),
        repeat_share=args.repeat_share,
        distinct=args.distinct,
        baseline_ref=args.baseline_ref,
        triton_instances=max(1, args.triton_instances),
        triton_max_batch_size=args.triton_max_batch_size,
        rounds=args.rounds,
    )

    def progress(name: str) -> None:
        print(f"benchmark: {name} ...", file=sys.stderr, flush=True)

    with _quiet_stdout(args.json):
        report = run_benchmark(opts, progress)
    if args.json:
        print(orjson.dumps(report).decode())
    else:
        print(format_table(report))
    failed = any(r.get("error") for r in report["results"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
