"""Demo request producer for the compose stack: JSON requests at a steady rate.

Each request is ``{"id": ..., "entity": ...}`` with an entity that model-init seeded in
Redis (``e0`` ... ``e568``); a share of them (``BAD_FRACTION``) names an unknown entity or
is not JSON, so the dead-letter topic has something in it too. Settings come from the
environment: ``BOOTSTRAP_SERVERS``, ``TOPIC``, ``RATE`` (requests/s), ``COUNT`` (0 = until
stopped), ``ENTITIES``, ``BAD_FRACTION``. Stops cleanly on SIGTERM.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
import uuid

from confluent_kafka import KafkaException, Producer


def make_request(
    seq: int, rng: random.Random, entities: int, bad_fraction: float
) -> tuple[bytes, bytes]:
    """One request as (key, value), keyed by entity; ``bad_fraction`` of them are refused."""
    rid = f"demo-{seq}-{uuid.uuid4().hex[:8]}"
    entity = f"e{rng.randrange(entities)}"
    if rng.random() < bad_fraction:
        if rng.random() < 0.5:
            return entity.encode(), b"{not json"
        entity = "no-such-entity"
    return entity.encode(), json.dumps({"id": rid, "entity": entity}).encode()


def main() -> int:
    bootstrap = os.environ.get("BOOTSTRAP_SERVERS", "kafka:9092")
    topic = os.environ.get("TOPIC", "streamfer-requests")
    rate = float(os.environ.get("RATE", "200"))
    count = int(os.environ.get("COUNT", "0"))
    entities = int(os.environ.get("ENTITIES", "569"))
    bad_fraction = float(os.environ.get("BAD_FRACTION", "0.01"))

    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True}
    )
    failures = 0

    def on_delivery(err: object, _msg: object) -> None:
        nonlocal failures
        if err is not None:
            failures += 1

    producer.list_topics(topic, timeout=30)
    rng = random.Random()
    print(f"producing to {topic} on {bootstrap} at {rate:g}/s", flush=True)
    start = time.monotonic()
    sent = 0
    while not stopping and (count == 0 or sent < count):
        key, value = make_request(sent, rng, entities, bad_fraction)
        try:
            producer.produce(topic, value, key, on_delivery=on_delivery)
        except BufferError:
            producer.poll(0.1)
            continue
        except KafkaException as exc:
            print(f"produce failed: {exc}", file=sys.stderr, flush=True)
            return 1
        sent += 1
        producer.poll(0)
        if rate > 0:
            ahead = sent / rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
        if sent % 10_000 == 0:
            print(f"{sent} requests, {failures} delivery failures", flush=True)
    left = producer.flush(30)
    print(f"stopped after {sent} requests ({failures} failed, {left} unflushed)", flush=True)
    return 0 if failures == 0 and left == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
