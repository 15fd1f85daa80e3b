"""How long ``streamfer run`` takes to serve, phase by phase.

Each run starts one worker on a fresh group (its request topic has 4 partitions and a
backlog of requests) and polls its HTTP endpoints every 5 ms from the moment the process
is spawned:

- ``http_s``: the first answer at all: the interpreter, imports, config and logging
  (the server starts before any model loads);
- ``models_s``: ``/healthz`` 200: every model loaded, checked against its features and
  warmed;
- ``ready_s``: ``/readyz`` 200: the Kafka clients have metadata, the producer its
  idempotence PID, and the group has given this worker its partitions;
- ``first_result_s``: the first result on the result topic.

Both group protocols are measured: ``classic`` on a broker with Kafka's default
``group.initial.rebalance.delay.ms`` (3 s, which holds back the first member of an empty
group) and ``consumer`` (KIP-848), which has no such delay. Run with
``python -m benchmarks.cold_start [--runs N] [--json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from benchmarks.models import make_model
from streamfer_dev.harness import WorkerProcess, produce_requests, worker_config_toml
from streamfer_dev.modelgen import seed_entities
from streamfer_dev.stack import free_port, local_kafka, local_redis
from worker.kafka import ensure_topics

__all__ = ["main", "measure_start"]

PHASES = ("http_s", "models_s", "ready_s", "first_result_s")
REBALANCE_DELAY_MS = 3000
"""Kafka's default ``group.initial.rebalance.delay.ms``, as on a production broker."""


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=0.5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return None


def measure_start(
    bootstrap: str, redis_url: str, work: Path, protocol: str, timeout_s: float = 60.0
) -> dict[str, float]:
    """One cold start on a fresh group and topics; seconds from spawn to each phase."""
    run = uuid.uuid4().hex[:8]
    topics = {name: f"cold-{run}-{name}" for name in ("requests", "results", "dlq")}
    ensure_topics(bootstrap, [(t, 4) for t in topics.values()])
    model = make_model("light", work)
    client = redis.Redis.from_url(redis_url)
    entities = seed_entities(client, model, prefix=f"{run}-")
    client.close()
    requests = [
        (rid, e.encode(), orjson.dumps({"id": rid, "entity": e}))
        for rid, e in ((f"{run}-{i}", e) for i, e in enumerate(entities[:200]))
    ]
    produce_requests(bootstrap, topics["requests"], requests)
    port = free_port()
    config = work / f"cold-{run}.toml"
    config.write_text(
        worker_config_toml(
            bootstrap=bootstrap,
            redis_url=redis_url,
            group=f"cold-{run}",
            request_topic=topics["requests"],
            result_topic=topics["results"],
            dead_letter_topic=topics["dlq"],
            model_path=model.path,
            fields=model.fields,
            group_protocol=protocol,
            extra=f'[metrics]\nhost = "127.0.0.1"\nport = {port}\n',
        )
    )
    # assigned, not subscribed: a group of its own would wait out the broker's delay too
    reader = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"cold-{run}-reader",
            "enable.auto.commit": False,
        }
    )
    reader.assign([TopicPartition(topics["results"], p, OFFSET_BEGINNING) for p in range(4)])
    reader.poll(0.5)
    worker = WorkerProcess(config, work / f"cold-{run}.log")
    seen: dict[str, float] = {}
    base = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    worker.start()
    try:
        while len(seen) < len(PHASES) and time.monotonic() - started < timeout_s:
            now = time.monotonic() - started
            if "http_s" not in seen or "models_s" not in seen:
                status = _status(f"{base}/healthz")
                if status is not None:
                    seen.setdefault("http_s", now)
                if status == 200:
                    seen.setdefault("models_s", now)
            if "models_s" in seen and "ready_s" not in seen and _status(f"{base}/readyz") == 200:
                seen["ready_s"] = time.monotonic() - started
            if "first_result_s" not in seen:
                msg = reader.poll(0.005)
                if msg is not None and msg.error() is None:
                    seen["first_result_s"] = time.monotonic() - started
            else:
                time.sleep(0.005)
    finally:
        worker.terminate()
        reader.close()
    missing = [p for p in PHASES if p not in seen]
    if missing:
        raise RuntimeError(f"no {missing} within {timeout_s} s; log: {worker.log_text()[-2000:]}")
    return {p: round(seen[p], 3) for p in PHASES}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cold_start")
    parser.add_argument("--runs", type=int, default=3, help="cold starts per group protocol")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    with contextlib.ExitStack() as stack:
        bootstrap = stack.enter_context(local_kafka(initial_rebalance_delay_ms=REBALANCE_DELAY_MS))
        redis_url = stack.enter_context(local_redis())
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="streamfer-cold-")))
        for protocol in ("classic", "consumer"):
            runs = [measure_start(bootstrap, redis_url, work, protocol) for _ in range(args.runs)]
            report[protocol] = {
                "runs": runs,
                "median": {p: statistics.median(r[p] for r in runs) for p in PHASES},
            }
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"cold start of 'streamfer run', light model ({report['date']}), seconds from spawn:")
    print(f"{'protocol':10} {'run':>4} " + " ".join(f"{p:>15}" for p in PHASES))
    for protocol in ("classic", "consumer"):
        for i, r in enumerate(report[protocol]["runs"], 1):
            print(f"{protocol:10} {i:>4} " + " ".join(f"{r[p]:>15.3f}" for p in PHASES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
