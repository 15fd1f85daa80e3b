"""Two models on one batch in one worker (a model graph) against the same two models
chained through a Kafka topic by two workers, as a pipeline of one model per service
(Seldon Core 2's way) runs them.

The models: the demo random forest (``streamfer_dev.modelgen.make_classifier``, 30
features carried inline by each request) and, after it, ``make_mean`` over its
probabilities (a stand-in head that costs next to nothing, so the figures show what the
hop costs, not a model). The graph is ``[[pipelines.steps]]`` cls then head; the chain
is worker A serving cls to a middle topic and worker B reading A's results there (its
features the ``outputs.scores`` array of each) and serving head.

Each side runs on fresh topics, once its workers own their partitions: a burst of
``--backlog`` requests produced at once (records/s from the first request's CreateTime
to the last result's), then
``--rate`` requests a second for ``--seconds`` (latency: a final result's CreateTime
minus its request's, p50 and p99). Run: ``python -m benchmarks.graph_chain``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from streamfer_dev.harness import (
    WorkerProcess,
    percentile,
    produce_requests,
    wait_for_assignment,
)
from streamfer_dev.modelgen import make_classifier, make_mean
from streamfer_dev.stack import local_kafka, local_redis
from worker.kafka import ensure_topics

PARTITIONS = 2


def services(bootstrap: str, redis_url: str, group: str) -> str:
    return f"""
[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "{group}"

[redis]
url = "{redis_url}"
"""


def pipeline(name: str, source: str, sink: str, body: str) -> str:
    return f"""
[[pipelines]]
name = "{name}"
request_topics = ["{source}"]
result_topic = "{sink}"
dead_letter_topic = "{sink}.dead"

[pipelines.batch]
max_batch_size = 256
max_wait_ms = 10
{body}"""


def graph_configs(
    folder: Path, bootstrap: str, redis_url: str, topics: dict[str, str], models: dict[str, Any]
) -> list[Path]:
    fields = orjson.dumps(models["fields"]).decode()
    body = f"""
[pipelines.request]
features_array = {fields}

[[pipelines.steps]]
name = "cls"
model = {{ path = "{models["cls"]}", name = "cls" }}
inputs = {{ X = {fields} }}

[[pipelines.steps]]
name = "head"
model = {{ path = "{models["head"]}", name = "head" }}
inputs = {{ x = "cls.scores", y = "cls.scores" }}
"""
    text = services(bootstrap, redis_url, topics["group"])
    text += pipeline("graph", topics["requests"], topics["results"], body)
    path = folder / "graph.toml"
    path.write_text(text)
    return [path]


def chain_configs(
    folder: Path, bootstrap: str, redis_url: str, topics: dict[str, str], models: dict[str, Any]
) -> list[Path]:
    fields = orjson.dumps(models["fields"]).decode()
    first = f"""
[pipelines.request]
features_array = {fields}

[pipelines.model]
path = "{models["cls"]}"
name = "cls"
inputs = {{ X = {fields} }}
"""
    second = f"""
[pipelines.request]
features = "outputs.scores"
features_array = ["p0", "p1"]

[pipelines.model]
path = "{models["head"]}"
name = "head"
inputs = {{ x = ["p0", "p1"], y = ["p0", "p1"] }}
"""
    a = folder / "chain-a.toml"
    a.write_text(
        services(bootstrap, redis_url, topics["group"] + "-a")
        + pipeline("cls", topics["requests"], topics["middle"], first)
    )
    b = folder / "chain-b.toml"
    b.write_text(
        services(bootstrap, redis_url, topics["group"] + "-b")
        + pipeline("head", topics["middle"], topics["results"], second)
    )
    return [a, b]


def requests(features: Any, count: int, prefix: str) -> list[tuple[str, bytes, bytes]]:
    rows = features.tolist()
    return [
        (
            f"{prefix}{i}",
            f"k{i}".encode(),
            orjson.dumps({"id": f"{prefix}{i}", "features": rows[i % len(rows)]}),
        )
        for i in range(count)
    ]


def times(bootstrap: str, topic: str, ids: set[str], timeout: float) -> dict[str, int]:
    """id -> the CreateTime of its record on ``topic``, until every one of ``ids`` is seen."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    seen: dict[str, int] = {}
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions])
        deadline = time.monotonic() + timeout
        while not ids <= seen.keys() and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.2):
                if msg.error() is None:
                    doc = orjson.loads(msg.value() or b"null")
                    seen.setdefault(doc["id"], msg.timestamp()[1])
    finally:
        consumer.close()
    return seen


def run_side(
    name: str, bootstrap: str, redis_url: str, models: dict[str, Any], opts: argparse.Namespace
) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    topics = {
        "requests": f"bench-req-{tag}",
        "middle": f"bench-mid-{tag}",
        "results": f"bench-res-{tag}",
        "group": f"bench-{name}-{tag}",
    }
    ensure_topics(
        bootstrap,
        [(topics[t], PARTITIONS) for t in ("requests", "middle", "results")]
        + [(f"{topics[t]}.dead", 1) for t in ("middle", "results")],
    )
    backlog = requests(models["features"], opts.backlog, "b")
    folder = Path(tempfile.mkdtemp(prefix=f"graph-chain-{name}-"))
    write = graph_configs if name == "graph" else chain_configs
    workers = [
        WorkerProcess(path, folder / f"{path.stem}.log").start()
        for path in write(folder, bootstrap, redis_url, topics, models)
    ]
    try:
        wait_for_assignment(workers, PARTITIONS, timeout=120)
        produce_requests(bootstrap, topics["requests"], backlog)
        burst = {t for t, _, _ in backlog}
        done = times(bootstrap, topics["results"], burst, 600)
        first = min(times(bootstrap, topics["requests"], burst, 60).values())
        drained_s = (max(done.values()) - first) / 1000.0
        paced = requests(models["features"], int(opts.rate * opts.seconds), "p")
        produce_requests(bootstrap, topics["requests"], paced, rate=opts.rate)
        ids = {t for t, _, _ in paced}
        sent = times(bootstrap, topics["requests"], ids, 60)
        got = times(bootstrap, topics["results"], ids, 120)
        latencies = [float(got[i] - sent[i]) for i in ids if i in got and i in sent]
    finally:
        for worker in workers:
            worker.terminate()
    return {
        "contender": name,
        "workers": len(workers),
        "backlog": opts.backlog,
        "backlog_results": len(done),
        "records_per_s": round(len(done) / drained_s, 1) if drained_s > 0 else None,
        "rate": opts.rate,
        "paced_results": len(latencies),
        "p50_ms": round(percentile(latencies, 50), 1),
        "p99_ms": round(percentile(latencies, 99), 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--backlog", type=int, default=20_000, help="Requests sent at once.")
    parser.add_argument("--rate", type=float, default=500.0, help="Paced requests a second.")
    parser.add_argument("--seconds", type=float, default=20.0, help="How long to pace them.")
    parser.add_argument("--out", type=Path, help="Also write the rows here, as JSON.")
    opts = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="graph-chain-models-"))
    demo = make_classifier(folder / "cls.onnx")
    models = {
        "cls": demo.path,
        "head": make_mean(folder / "head.onnx", ["x", "y"], 2),
        "fields": demo.fields,
        "features": np.asarray(demo.features),
    }
    rows = []
    with local_kafka() as bootstrap, local_redis() as redis_url:
        for name in ("graph", "chain"):
            rows.append(run_side(name, bootstrap, redis_url, models, opts))
            print(json.dumps(rows[-1]), flush=True)
    if opts.out is not None:
        opts.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
