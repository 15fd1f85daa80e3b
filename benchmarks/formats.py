"""Avro requests against JSON requests: the same backlog, the same worker and model, in
one run.

Starts Apache Kafka, redis-server and a Schema Registry (Apicurio, ``streamfer_dev``),
seeds the light model's features, writes ``--records`` requests twice, as JSON and as
Avro framed for the registry (confluent-kafka's ``AvroSerializer``; the same ids and
entities), then drains each backlog with one ``streamfer run`` (a fresh group each),
the formats alternating for ``--rounds``. Reported per drain: records/s from the first to
the last result and the worker's CPU seconds per 10,000 results in between
(``benchmarks.measure``). Then the decode step alone, in this process: microseconds per
record of ``decode_requests`` over 256-record batches, JSON against Avro.

    python -m benchmarks.formats --records 100000 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient, topic_subject_name_strategy
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from benchmarks.measure import read_results, summarize
from benchmarks.models import make_model
from streamfer_dev.harness import WorkerProcess, worker_config_toml
from streamfer_dev.modelgen import seed_entities
from streamfer_dev.schema_registry import start_schema_registry
from streamfer_dev.stack import start_kafka, start_redis
from worker.kafka import ensure_topics
from worker.pipeline import RequestShape, decode_requests
from worker.registry import FramedRequests

AVRO_REQUEST = {
    "type": "record",
    "name": "ScoreRequest",
    "namespace": "streamfer.bench",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "entity", "type": "string"},
    ],
}
BATCH = 256


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="streamfer-formats-"))
    kafka, rds, registry = start_kafka(), start_redis(), start_schema_registry()
    try:
        report = _run(args, work, kafka.address, rds.address, registry.address)
        report["registry"] = registry.name
    finally:
        for service in (registry, rds, kafka):
            service.stop()
    if args.json:
        print(json.dumps(report))
    else:
        _print(report)
    return 0


def _run(
    args: Any, work: Path, bootstrap: str, redis_url: str, registry_url: str
) -> dict[str, Any]:
    model = make_model("light", work)
    client = redis.Redis.from_url(redis_url)
    entities = seed_entities(client, model, prefix="fmt-")
    client.close()
    run = uuid.uuid4().hex[:6]
    ids = [f"r{n}" for n in range(args.records)]
    docs = [{"id": rid, "entity": entities[n % len(entities)]} for n, rid in enumerate(ids)]
    topics = {fmt: f"fmt-{fmt}-{run}" for fmt in ("json", "avro")}
    ensure_topics(
        bootstrap,
        [(t, args.partitions) for t in topics.values()]
        + [(f"{t}-dlq", 1) for t in topics.values()],
    )
    registry = SchemaRegistryClient({"url": registry_url, "timeout": 10})
    topic_subjects = {"subject.name.strategy": topic_subject_name_strategy}
    avro = AvroSerializer(registry, json.dumps(AVRO_REQUEST), conf=topic_subjects)
    ctx = SerializationContext(topics["avro"], MessageField.VALUE)
    encoded = {
        "json": [json.dumps(d, separators=(",", ":")).encode() for d in docs],
        "avro": [avro(d, ctx) or b"" for d in docs],
    }
    for fmt, values in encoded.items():
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
        for rid, value in zip(ids, values, strict=True):
            while True:
                try:
                    producer.produce(topics[fmt], value, key=rid.encode())
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.flush(60)
    drains: dict[str, list[dict[str, Any]]] = {"json": [], "avro": []}
    for round_no in range(args.rounds):
        for fmt in ("json", "avro") if round_no % 2 == 0 else ("avro", "json"):
            drains[fmt].append(
                _drain(work, bootstrap, redis_url, registry_url, model, topics[fmt], fmt, set(ids))
            )
    decode_cost = _decode_cost(encoded, registry)
    registry.close()
    return {
        "records": args.records,
        "partitions": args.partitions,
        "drains": drains,
        "decode_us_per_record": decode_cost,
        "value_bytes": {fmt: statistics.mean(map(len, v)) for fmt, v in encoded.items()},
    }


def _drain(
    work: Path,
    bootstrap: str,
    redis_url: str,
    registry_url: str,
    model: Any,
    topic: str,
    fmt: str,
    ids: set[str],
) -> dict[str, Any]:
    group = f"{topic}-{uuid.uuid4().hex[:6]}"
    config = work / f"{group}.toml"
    text = worker_config_toml(
        bootstrap=bootstrap,
        redis_url=redis_url,
        group=group,
        request_topic=topic,
        result_topic=f"{topic}-results-{group}",
        dead_letter_topic=f"{topic}-dlq",
        model_path=model.path,
        fields=model.fields,
    )
    text = text.replace(
        "max_record_bytes =", f'request_format = "{fmt}"\nmax_record_bytes =', 1
    ).replace("[redis]", f'[schema_registry]\nurl = "{registry_url}"\n\n[redis]', 1)
    config.write_text(text)
    result_topic = f"{topic}-results-{group}"
    ensure_topics(bootstrap, [(result_topic, 4)])  # the reader starts before the worker
    worker = WorkerProcess(config, work / f"{group}.log").start()
    try:
        reading = read_results(
            bootstrap, result_topic, ids, pids=lambda: [worker.pid], alive=worker.alive
        )
    finally:
        worker.terminate()
    summary = summarize(reading, backlog=True, rss_mb=None)
    summary["format"] = fmt
    return summary


def _decode_cost(
    encoded: dict[str, list[bytes]], registry: SchemaRegistryClient
) -> dict[str, float]:
    """Microseconds per record of the decode step alone, best of three passes."""
    shape = RequestShape.simple(["f0"])
    framed = FramedRequests("avro", registry)
    cost: dict[str, float] = {}
    for fmt, values in encoded.items():
        batches = [values[i : i + BATCH] for i in range(0, len(values), BATCH)]
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            for batch in batches:
                loads = framed.for_batch(batch) if fmt == "avro" else None
                out = decode_requests(batch, shape, 1 << 20, loads)
                assert not out.rejections, out.rejections[:1]
            best = min(best, time.perf_counter() - started)
        cost[fmt] = round(best / len(values) * 1e6, 2)
    return cost


def _print(report: dict[str, Any]) -> None:
    print(f"{report['records']} requests, {report['partitions']} partitions, {report['registry']}")
    print("| format | value bytes | records/s | CPU s/10k | lost | dup |")
    print("|---|--:|--:|--:|--:|--:|")
    for fmt, drains in report["drains"].items():
        for d in drains:
            print(
                f"| {fmt} | {report['value_bytes'][fmt]:.0f} | {d['rps']:,.0f} | "
                f"{d['cpu_s_per_10k']} | {d['lost']} | {d['duplicates']} |"
            )
    cost = report["decode_us_per_record"]
    print(
        f"decode alone: JSON {cost['json']} us/record, Avro {cost['avro']} us/record "
        f"({cost['avro'] / cost['json']:.2f}x)"
    )


if __name__ == "__main__":
    raise SystemExit(main())
