"""An hour's soak on the three-broker cluster, with broker restarts and a Redis failover.

``python -m benchmarks.soak [--minutes 60] [--rate 200] [--restart-every 10]
[--mode at-least-once|exactly-once] [--out PATH.json] [--chart PATH.png]`` starts three
KRaft brokers (replication factor 3, ``min.insync.replicas = 2``), Redis under Sentinel
(a primary, a replica, three Sentinels; ``--redis cluster``: a Redis Cluster of three
primaries and three replicas) and two workers as a plain ``streamfer run``
that nothing restarts, and produces requests open-loop at ``--rate`` per second for
``--minutes``. Every ``--restart-every`` minutes one broker, in turn, is stopped
(SIGTERM) and started again, and the next fault waits until every replica is back in
sync; at about half time a Redis primary is SIGKILLed and its replica promoted
(``benchmarks.redis_failovers``).

Each minute gets a row: requests produced, results read, requests with no outcome
``--grace`` seconds after they were sent (lost so far), duplicates, dead letters, the
p50/p99 of request-to-result latency of the results read that minute, each worker's
RSS (``/proc/<pid>/status`` VmRSS) and CPU seconds, and the events. At the end the
stream stops, every outstanding outcome is awaited, and the run prints the table, the
totals, the seconds until every partition was served again after each event, and the
drift verdict (``benchmarks.soak_minutes.DRIFT_LIMITS``); ``--out`` writes all of it as
JSON (rewritten every minute, so an aborted run leaves its rows), ``--chart`` a PNG.
The stack and the workers are the fault harness's (``benchmarks.chaos``).
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from benchmarks import redis_failovers
from benchmarks.chaos import PARTITIONS, Env, Fleet, Run
from benchmarks.measure import cpu_seconds
from benchmarks.soak_minutes import Answer, Tally, drift, totals
from streamfer_dev.harness import produce_requests
from streamfer_dev.kafka_cluster import REPLICAS

__all__ = ["main", "schedule"]

DRAIN_S = 180.0
"""After the stream stops, how long the run waits for the last outcomes."""


def schedule(minutes: float, restart_every: float) -> list[tuple[float, str]]:
    """(seconds from the start, what): a broker restart every ``restart_every`` minutes,
    rotating over the brokers, none at the very end, and the Redis failover at half time
    (moved half an interval on when a restart falls there)."""
    events: list[tuple[float, str]] = []
    step = restart_every * 60
    n = 1
    while n * step < minutes * 60 - 30:
        events.append((n * step, f"restart broker {(n - 1) % REPLICAS + 1}"))
        n += 1
    failover = minutes * 30
    if any(abs(at - failover) < 60 for at, _ in events):
        failover += step / 2
    events.append((failover, "redis failover"))
    return sorted(events)


@dataclass
class Soak:
    """One run: the stack, the workers, the load and its bookkeeping."""

    env: Env
    failover: redis_failovers.Failover
    run: Run
    fleet: Fleet
    rate: float
    tally: Tally
    events: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)
    drain_until: float = float("inf")
    """Once the stream stopped: when the reader gives up waiting for the last outcomes."""

    def produce(self) -> None:
        """Open-loop requests ``s<n>`` until ``stopping``; each send is tallied."""
        entities = self.env.entities
        rng = random.Random(7)

        def requests() -> Iterator[tuple[str, bytes | None, bytes | None]]:
            n = 0
            while not self.stopping.is_set():
                entity = entities[rng.randrange(len(entities))]
                rid = f"s{n}"
                self.tally.sent_one(n, time.time())
                yield rid, entity.encode(), orjson.dumps({"id": rid, "entity": entity})
                n += 1

        try:
            produce_requests(
                self.env.bootstrap, self.run.requests_topic, requests(), rate=self.rate
            )
        except Exception as exc:  # the report says where the load stopped
            self.errors.append(f"producer: {exc}")

    def read(self) -> None:
        """Results and dead letters from the beginning, one tally call per batch."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.env.bootstrap,
            "group.id": f"soak-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
        if self.run.exactly_once:
            conf["isolation.level"] = "read_committed"
        consumer = Consumer(conf)
        results, dead = self.run.results_topic, self.run.dead_topic
        consumer.assign(
            [TopicPartition(results, p, OFFSET_BEGINNING) for p in range(PARTITIONS)]
            + [TopicPartition(dead, 0, OFFSET_BEGINNING)]
        )
        try:
            while not self.stopping.is_set() or self.tally.pending:
                answers: list[Answer] = []
                dead_numbers: list[int] = []
                for msg in consumer.consume(2000, 0.5):
                    if msg.error() is not None:
                        continue
                    doc = orjson.loads(msg.value() or b"null")
                    if msg.topic() == dead:
                        dead_numbers.append(_number(doc.get("request_id")))
                        continue
                    headers = dict(msg.headers() or [])
                    source = (
                        int(headers["streamfer.source_partition"] or b"0"),
                        int(headers["streamfer.source_offset"] or b"0"),
                    )
                    latency = msg.timestamp()[1] - doc["request_ts_ms"]
                    answers.append((_number(doc["id"]), source, float(latency)))
                self.tally.answered(answers, dead_numbers)
                if self.stopping.is_set() and time.time() > self.drain_until:
                    break
        finally:
            consumer.close()

    def hurt(self, plan: list[tuple[float, str]], start: float) -> None:
        """Run the planned faults at their times, each one after the last has ended."""
        for at, what in plan:
            if self.stopping.wait(max(0.0, start + at - time.time())):
                return
            began = time.time()
            self.run.fault()
            # listed at once, so the minute it began in names it however long it takes
            event: dict[str, Any] = {"at_s": round(began - start, 1), "what": what}
            self.events.append(event)
            try:
                event["detail"] = self._inject(what)
            except Exception as exc:  # recorded; the soak goes on
                event["detail"] = f"failed: {exc}"
                self.errors.append(f"{what}: {exc}")
            event["took_s"] = round(time.time() - began, 1)
            print(
                f"# {what} at {event['at_s']:.0f}s: {event['detail']} ({event['took_s']}s)",
                flush=True,
            )

    def _inject(self, what: str) -> str:
        if what.startswith("restart broker"):
            node = int(what.rsplit(" ", 1)[1])
            cluster = self.env.cluster
            cluster.stop_node(node)
            cluster.start_node(node)
            cluster.wait_in_sync(None)
            return f"broker {node} back in sync"
        return self.failover.fail()

    def sample(self, minute: int, now: float, cpu_before: dict[str, float]) -> dict[str, Any]:
        """Close the minute's row, with each worker's RSS and CPU seconds of the minute."""
        row = self.tally.close_minute(minute, now)
        row["rss_mb"], row["cpu_s"] = {}, {}
        for i, w in enumerate(self.fleet.workers, start=1):
            name = f"worker{i}"
            cpu = cpu_seconds([w.pid])
            row["rss_mb"][name] = _rss_mb(w.pid) if w.alive() else None
            row["cpu_s"][name] = round(cpu - cpu_before.get(name, 0.0), 2)
            cpu_before[name] = cpu
        row["events"] = [
            e["what"] for e in self.events if minute * 60 <= e["at_s"] < (minute + 1) * 60
        ]
        row["workers_alive"] = sum(w.alive() for w in self.fleet.workers)
        return row


def _number(rid: str | None) -> int:
    return int(rid[1:]) if rid and rid.startswith("s") else -1


def _rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


COLUMNS = (
    "minute",
    "produced",
    "results",
    "lost_so_far",
    "duplicates",
    "dead_letters",
    "p50_ms",
    "p99_ms",
)


def _line(row: dict[str, Any]) -> str:
    cells = [str(row[c]) for c in COLUMNS]
    cells += [str(row["rss_mb"]), str(row["cpu_s"]), ",".join(row["events"])]
    return " | ".join(cells)


def soak(args: argparse.Namespace) -> dict[str, Any]:
    """Start the stack, run the load with its faults for ``args.minutes``, drain, report."""
    ha = {"sentinel": redis_failovers.sentinel, "cluster": redis_failovers.cluster}[args.redis]
    with Env.start(cluster=True) as env, ha(env.model) as failover:
        return _soak_on(env, failover, args)


def _soak_on(
    env: Env, failover: redis_failovers.Failover, args: argparse.Namespace
) -> dict[str, Any]:
    run = Run(env, "soak", 0, exactly_once=args.mode == "exactly-once")
    fleet = run.fleet(redis_table=failover.redis_table)
    run.start_workers(fleet, 2)
    run.track_recovery()
    state = Soak(env, failover, run, fleet, args.rate, Tally(grace_s=args.grace))
    plan = schedule(args.minutes, args.restart_every)
    start = time.time()
    threads = [threading.Thread(target=f, daemon=True) for f in (state.produce, state.read)]
    threads.append(threading.Thread(target=state.hurt, args=(plan, start), daemon=True))
    for t in threads:
        t.start()
    print(" | ".join([*COLUMNS, "rss_mb", "cpu_s", "events"]), flush=True)
    cpu_before: dict[str, float] = {}
    for minute in range(int(args.minutes)):
        time.sleep(max(0.0, start + (minute + 1) * 60 - time.time()))
        state.rows.append(state.sample(minute, time.time(), cpu_before))
        print(_line(state.rows[-1]), flush=True)
        if args.out:
            Path(args.out).write_bytes(
                orjson.dumps(_report(state, args, lost=None), option=orjson.OPT_INDENT_2)
            )
    state.drain_until = time.time() + DRAIN_S
    state.stopping.set()
    for t in threads:
        t.join(DRAIN_S + 60)
    lost = state.tally.overdue(float("inf"))
    report = _report(state, args, lost=lost)
    assert run.history is not None
    run.history.stop()
    report["served_again_s"] = [run.history.after(f / 1000) for f in run.faults]
    report["exit_codes"] = fleet.stop_all()
    return report


def _report(state: Soak, args: argparse.Namespace, *, lost: int | None) -> dict[str, Any]:
    workers = [f"worker{i}" for i in range(1, len(state.fleet.workers) + 1)]
    out: dict[str, Any] = {
        "mode": args.mode,
        "redis": args.redis,
        "rate": args.rate,
        "minutes": args.minutes,
        "restart_every": args.restart_every,
        "grace_s": args.grace,
        "rows": state.rows,
        "events": state.events,
        "errors": state.errors,
    }
    if lost is not None:
        out["totals"] = totals(state.rows, state.tally, lost)
        out["drift"] = drift(state.rows, workers)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    parser.add_argument("--minutes", type=int, default=60, help="how long the load runs")
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second, open-loop")
    parser.add_argument(
        "--restart-every", type=float, default=10.0, help="minutes between broker restarts"
    )
    parser.add_argument(
        "--mode",
        choices=("at-least-once", "exactly-once"),
        default="at-least-once",
        help="delivery",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=60.0,
        help="seconds after which a request with no outcome counts as lost",
    )
    parser.add_argument(
        "--redis",
        choices=("sentinel", "cluster"),
        default="sentinel",
        help="features from Redis under Sentinel, or from a Redis Cluster (3 primaries, 3 "
        "replicas); its failover kills a primary either way",
    )
    parser.add_argument("--out", default=None, help="write the report as JSON here")
    parser.add_argument("--chart", default=None, help="write a PNG chart here")
    args = parser.parse_args(argv)
    report = soak(args)
    print(
        orjson.dumps(
            {
                k: report[k]
                for k in ("totals", "drift", "events", "served_again_s", "errors", "exit_codes")
            },
            option=orjson.OPT_INDENT_2,
        ).decode()
    )
    if args.out:
        Path(args.out).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    if args.chart:
        from benchmarks.soak_chart import draw

        draw(report, Path(args.chart))
    held = report["totals"]["lost"] == 0 and report["drift"]["held"] and not report["errors"]
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
