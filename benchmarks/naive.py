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

import sys
from collections.abc import Sequence
from typing import cast

import numpy as np
import orjson
import redis
from confluent_kafka import Producer

from benchmarks.hand_written import (
    loop_parser,
    producer_settings,
    stop_on_signals,
    subscribed_consumer,
)
from benchmarks.session import load_session

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    args = loop_parser("python -m benchmarks.naive").parse_args(argv)
    stop = stop_on_signals()
    fields = args.fields.split(",")
    session, input_name = load_session(args.model)
    meta = {"name": args.model_name, "version": "1"}
    client = redis.Redis.from_url(args.redis_url)
    producer = Producer(producer_settings(args.bootstrap))
    consumer = subscribed_consumer(args.bootstrap, args.group, args.request_topic)
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
