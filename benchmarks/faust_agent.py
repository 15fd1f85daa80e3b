"""The faust-streaming contender: the same job written the idiomatic faust way.

One agent on the request topic takes up to ``BENCH_MAX_BATCH`` events at a time
(``stream.take_events(max, within=BENCH_WITHIN_MS)``, the event flavour of
``stream.take`` so each request's Kafka timestamp is at hand), fetches the distinct
entities' features with one ``redis.asyncio`` pipeline (HMGET per hash, or GET per packed
float32 vector with ``BENCH_LAYOUT=packed``), runs the model in a
worker thread (``loop.run_in_executor``, ONNX Runtime with one intra-op thread, as
streamfer's default), and sends one result per request (streamfer's result JSON:
``id``, ``key``, ``outputs``, ``model``, ``request_ts_ms``) with ``topic.send``. faust
acknowledges the events after each take and commits on its own interval; its producer and
consumer are aiokafka with faust's defaults. Configuration comes from ``BENCH_*``
environment variables because faust's command line owns ``argv``; run it as
``python -m benchmarks.faust_agent worker -l warn``. It prints ``ready: owning N
partitions`` when the group assigns it request partitions.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import faust
import numpy as np
import orjson
import redis.asyncio as aioredis

from benchmarks.session import load_session

__all__ = ["app", "score"]

BOOTSTRAP = os.environ.get("BENCH_BOOTSTRAP", "127.0.0.1:9092")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
MODEL_PATH = os.environ.get("BENCH_MODEL", "model.onnx")
MODEL_NAME = os.environ.get("BENCH_MODEL_NAME", "model")
FIELDS = os.environ.get("BENCH_FIELDS", "f0").split(",")
PACKED = os.environ.get("BENCH_LAYOUT", "hash") == "packed"
KEY_TEMPLATE = os.environ.get("BENCH_KEY_TEMPLATE", "features:{entity}")
REQUEST_TOPIC = os.environ.get("BENCH_REQUEST_TOPIC", "bench-requests")
RESULT_TOPIC = os.environ.get("BENCH_RESULT_TOPIC", "bench-results")
GROUP = os.environ.get("BENCH_GROUP", "bench-faust")
MAX_BATCH = int(os.environ.get("BENCH_MAX_BATCH", "256"))
WITHIN_S = float(os.environ.get("BENCH_WITHIN_MS", "20")) / 1000.0

app = faust.App(
    GROUP,
    broker=f"kafka://{BOOTSTRAP}",
    value_serializer="raw",
    key_serializer="raw",
    store="memory://",
    web_enabled=False,  # and were it on, only on loopback
    web_bind="127.0.0.1",
    consumer_auto_offset_reset="earliest",
    topic_partitions=4,
)
requests_topic = app.topic(REQUEST_TOPIC, key_serializer="raw", value_serializer="raw")
results_topic = app.topic(RESULT_TOPIC, key_serializer="raw", value_serializer="raw")


@app.on_partitions_assigned.connect
async def _announce(_sender: Any, /, *args: Any, signal: Any, **_kwargs: Any) -> None:
    assigned: set[Any] = args[0] if args else set()
    owned = sum(1 for tp in assigned if tp.topic == REQUEST_TOPIC)
    if owned:
        print(f"ready: owning {owned} partitions", flush=True)


@app.agent(requests_topic)
async def score(stream: Any) -> None:
    """Enrich, infer and publish one take of events at a time."""
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")
    session, input_name = load_session(MODEL_PATH)
    client = aioredis.Redis.from_url(REDIS_URL)
    prefix, suffix = KEY_TEMPLATE.split("{entity}", 1)
    meta = {"name": MODEL_NAME, "version": "1"}
    async for events in stream.take_events(MAX_BATCH, within=WITHIN_S):
        docs = [orjson.loads(event.value) for event in events]
        distinct = list(dict.fromkeys(doc["entity"] for doc in docs))
        pipe = client.pipeline(transaction=False)
        for entity in distinct:
            key = f"{prefix}{entity}{suffix}"
            if PACKED:
                pipe.get(key)
            else:
                pipe.hmget(key, FIELDS)
        rows = await pipe.execute()
        if PACKED:
            table = np.frombuffer(b"".join(rows), dtype="<f4").reshape(len(rows), -1)
        else:
            table = np.array([[float(v) for v in row] for row in rows], dtype=np.float32)
        where = {entity: i for i, entity in enumerate(distinct)}
        matrix = table[[where[doc["entity"]] for doc in docs]]
        labels, scores = await loop.run_in_executor(
            executor, session.run, None, {input_name: matrix}
        )
        for event, doc, label, row in zip(
            events, docs, labels.tolist(), scores.tolist(), strict=True
        ):
            key = event.key
            await results_topic.send(
                key=key,
                value=orjson.dumps(
                    {
                        "id": doc["id"],
                        "key": key.decode() if key is not None else None,
                        "outputs": {"label": label, "scores": row},
                        "model": meta,
                        "request_ts_ms": round(event.message.timestamp * 1000),
                    }
                ),
            )


if __name__ == "__main__":
    app.main()
