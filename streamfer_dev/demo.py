"""The demo: the whole job on an embedded default stack, measured.

Starts a broker (Apache Kafka when Java is present, else Tansu) and Redis, trains a
small classifier on a data set bundled with scikit-learn, seeds Redis with one feature
hash per entity, starts worker processes in one group on a 4-partition topic, streams
requests (a few deliberately bad) through them, reads every result and dead letter back,
and reports records, results, lost, duplicates, throughput and end-to-end latency.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
import redis

from streamfer_dev.harness import (
    WorkerProcess,
    collect_outcomes,
    percentile,
    produce_requests,
    wait_for_assignment,
    worker_config_toml,
)
from streamfer_dev.modelgen import make_classifier, seed_entities
from streamfer_dev.stack import Service, local_redis, start_kafka, start_tansu
from worker.errors import StackError
from worker.kafka import ensure_topics

__all__ = ["DemoOptions", "make_requests", "print_report", "run_demo"]

BrokerChoice = Literal["auto", "kafka", "tansu", "external"]

# Tansu answers a group join after about session.timeout.ms / 2 and holds every fetch
# for the whole fetch.wait.max.ms, so the demo tunes both down for it.
TANSU_CONSUMER_OPTIONS: dict[str, Any] = {"fetch.wait.max.ms": 10}
TANSU_SESSION_TIMEOUT_MS = 6000


@dataclass(frozen=True)
class DemoOptions:
    broker: BrokerChoice = "auto"
    records: int = 20_000
    workers: int = 2
    partitions: int = 4
    rate: float = 0.0
    bad_fraction: float = 0.01
    seed: int = 7
    share_group: bool = False
    """Workers as members of one share group (KIP-932): Apache Kafka only."""


def make_requests(
    n: int, entities: list[str], bad_fraction: float, seed: int
) -> tuple[list[tuple[str, bytes | None, bytes | None]], set[str], set[str]]:
    """(tag, key, value) triples, the good request ids and the tags of bad records."""
    rng = random.Random(seed)
    bad_every = int(1 / bad_fraction) if bad_fraction > 0 else 0
    kinds: list[Callable[[int], bytes]] = [
        lambda i: b'{"id": "r%d", "entity": ' % i,  # truncated JSON
        lambda i: b'{"id": "r%d", "entity": "ghost-%d"}' % (i, i),  # unknown entity
        lambda i: b'{"id": "r%d", "features": {"f0": NaN}}' % i,  # NaN is not JSON
        lambda i: b'{"id": %d, "entity": "e1"}' % i,  # id of the wrong type
        lambda i: b"",  # empty value
    ]
    out: list[tuple[str, bytes | None, bytes | None]] = []
    good: set[str] = set()
    bad: set[str] = set()
    for i in range(n):
        entity = entities[rng.randrange(len(entities))]
        key = entity.encode()
        tag = f"r{i}"
        if bad_every and i % bad_every == bad_every // 2:
            out.append((tag, key, kinds[(i // bad_every) % len(kinds)](i)))
            bad.add(tag)
        else:
            out.append((tag, key, orjson.dumps({"id": tag, "entity": entity})))
            good.add(tag)
    return out, good, bad


@contextlib.contextmanager
def _broker(choice: BrokerChoice) -> Iterator[tuple[str, str]]:
    if choice == "external":
        address = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
        if not address:
            raise StackError("--broker external needs KAFKA_BOOTSTRAP_SERVERS")
        yield address, "external"
        return
    if choice == "auto":
        choice = "kafka" if shutil.which("java") and shutil.which("mvn") else "tansu"
    svc: Service = start_kafka() if choice == "kafka" else start_tansu()
    try:
        yield svc.address, choice
    finally:
        svc.stop()


def run_demo(opts: DemoOptions) -> dict[str, Any]:
    """Run the whole demo and return its report."""
    with (
        _broker(opts.broker) as (bootstrap, broker),
        local_redis() as redis_url,
        tempfile.TemporaryDirectory(prefix="streamfer-demo-") as tmp,
    ):
        work = Path(tmp)
        run_id = uuid.uuid4().hex[:8]
        requests_topic = f"demo-requests-{run_id}"
        results_topic = f"demo-results-{run_id}"
        dead_topic = f"demo-dead-letters-{run_id}"
        ensure_topics(
            bootstrap,
            [(requests_topic, opts.partitions), (results_topic, opts.partitions), (dead_topic, 1)],
        )

        model = make_classifier(work / "model.onnx")
        client = redis.Redis.from_url(redis_url)
        entities = seed_entities(client, model, prefix=f"{run_id}-")
        client.close()

        tansu = broker == "tansu"
        if tansu and opts.share_group:
            raise StackError("--share-group needs Apache Kafka (--broker kafka or external)")
        consumer_options = TANSU_CONSUMER_OPTIONS if tansu else {}
        config = work / "worker.toml"
        config.write_text(
            worker_config_toml(
                bootstrap=bootstrap,
                redis_url=redis_url,
                group=f"demo-{run_id}",
                request_topic=requests_topic,
                result_topic=results_topic,
                dead_letter_topic=dead_topic,
                model_path=model.path,
                fields=model.fields,
                consumer_options=consumer_options,
                session_timeout_ms=TANSU_SESSION_TIMEOUT_MS if tansu else 10_000,
                share_group=opts.share_group,
            )
        )
        workers = [
            WorkerProcess(config, work / f"worker-{i}.log").start() for i in range(opts.workers)
        ]
        try:
            wait_for_assignment(workers, opts.partitions, timeout=60)
            requests, good, bad_tags = make_requests(
                opts.records, entities, opts.bad_fraction, opts.seed
            )
            positions = produce_requests(bootstrap, requests_topic, requests, rate=opts.rate)
            bad_positions = {positions[t] for t in bad_tags}
            outcomes = collect_outcomes(
                bootstrap,
                results_topic,
                dead_topic,
                good,
                bad_positions,
                timeout=120,
                consumer_options=consumer_options,
            )
        finally:
            for w in workers:
                w.terminate()
        lost = outcomes.lost(good, bad_positions)
        elapsed_ms = (outcomes.last_result_ms or 0) - (outcomes.first_request_ms or 0)
        n_out = sum(outcomes.results.values()) + sum(outcomes.dead_letters.values())
        report = {
            "records": opts.records,
            "results": len(outcomes.results),
            "lost": len(lost),
            "duplicates": outcomes.duplicates(),
            "dead_letters": len(outcomes.dead_letters),
            "throughput_rps": round(n_out / (elapsed_ms / 1000.0), 1) if elapsed_ms > 0 else 0.0,
            "p50_ms": round(percentile(outcomes.latencies_ms, 50), 2),
            "p99_ms": round(percentile(outcomes.latencies_ms, 99), 2),
            "broker": broker,
            "share_group": opts.share_group,
        }
        if lost:
            report["_worker_logs"] = ["\n".join(w.log_text().splitlines()[-15:]) for w in workers]
        return report


def print_report(report: dict[str, Any], *, as_json: bool) -> None:
    public = {k: v for k, v in report.items() if not k.startswith("_")}
    if as_json:
        print(orjson.dumps(public).decode())
        return
    group = " (share group)" if public.get("share_group") else ""
    print(f"broker        {public['broker']}{group}")
    print(f"records       {public['records']}")
    print(f"results       {public['results']}")
    print(f"dead letters  {public['dead_letters']}")
    print(f"lost          {public['lost']}")
    print(f"duplicates    {public['duplicates']}")
    print(f"throughput    {public['throughput_rps']:.0f} records/s")
    print(f"latency p50   {public['p50_ms']:.1f} ms   p99 {public['p99_ms']:.1f} ms")
    for tail in report.get("_worker_logs", []):
        print("--- worker log ---\n" + tail)
