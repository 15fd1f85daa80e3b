"""The naive baseline: the per-record loop most first versions of such a service are.

``python -m benchmarks.naive --bootstrap B --redis-url U --model M --fields f0,f1,...
--request-topic T --result-topic R --group G [--layout hash|packed]`` polls one message,
HMGETs its entity's hash (or GETs its packed float32 vector), runs ONNX Runtime on that
one row, produces the result (the same JSON shape as streamfer's: ``id``, ``key``,
``outputs``, ``model``, ``request_ts_ms``) and commits that record's offset
synchronously, one record at a time. Kafka clients use streamfer's producer settings
(idempotent, acks=all, linger 5 ms, lz4) and ONNX Runtime one intra-op thread, so only
the shape of the loop differs. It prints ``ready: owning N partitions`` on assignment and
stops, flushing, on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any, cast

import numpy as np
import orjson
import redis
from confluent_kafka import Consumer, Producer, TopicPartition

from benchmarks.session import load_session

__all__ = ["main", "producer_settings"]


def producer_settings(bootstrap: str) -> dict[str, Any]:
    """streamfer's producer settings, for a like-for-like baseline."""
    return {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "compression.type": "lz4",
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.naive")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--model-name", default="model")
    parser.add_argument("--fields", required=True, help="comma-separated hash fields")
    parser.add_argument("--key-template", default="features:{entity}")
    parser.add_argument("--layout", choices=["hash", "packed"], default="hash")
    parser.add_argument("--request-topic", required=True)
    parser.add_argument("--result-topic", required=True)
    parser.add_argument("--group", required=True)
    args = parser.parse_args(argv)

    stop = {"now": False}

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    fields = args.fields.split(",")
    session, input_name = load_session(args.model)
    meta = {"name": args.model_name, "version": "1"}
    client = redis.Redis.from_url(args.redis_url)
    producer = Producer(producer_settings(args.bootstrap))
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )

    def on_assign(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
        print(f"ready: owning {len(partitions)} partitions", flush=True)

    consumer.subscribe([args.request_topic], on_assign=on_assign)
    prefix, suffix = args.key_template.split("{entity}", 1)
    packed = args.layout == "packed"
    try:
        while not stop["now"]:
            msg = consumer.poll(0.1)
            if msg is None or msg.error() is not None:
                continue
            request = orjson.loads(msg.value() or b"null")
            where = f"{prefix}{request['entity']}{suffix}"
            if packed:
                blob = cast(bytes, client.get(where))
                row = np.frombuffer(blob, dtype="<f4").reshape(1, -1)
            else:
                values = cast(list[bytes], client.hmget(where, fields))
                row = np.array([[float(v) for v in values]], dtype=np.float32)
            label, scores = session.run(None, {input_name: row})
            key = msg.key()  # the result's key is the request's
            producer.produce(
                args.result_topic,
                orjson.dumps(
                    {
                        "id": request["id"],
                        "key": key.decode() if key is not None else None,
                        "outputs": {"label": int(label[0]), "scores": scores[0].tolist()},
                        "model": meta,
                        "request_ts_ms": msg.timestamp()[1],
                    }
                ),
                key,
            )
            producer.poll(0)
            consumer.commit(message=msg, asynchronous=False)
    finally:
        producer.flush(30)
        consumer.close()
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
