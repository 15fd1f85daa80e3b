"""The competent baseline: the batch loop an experienced user writes by hand.

``python -m benchmarks.batch_loop --bootstrap B --redis-url U --model M --fields f0,...
--request-topic T --result-topic R --group G [--layout hash|packed] [--batch 256]``
consumes up to ``--batch`` records waiting at most ``CONSUME_WAIT_S`` (10 ms: a lone
request is not held for a full batch), fetches every record's features in one Redis
round trip (a non-transactional pipeline of HMGETs, or one MGET of packed float32
vectors), runs ONNX Runtime once on the batch, produces one result per record (the same
JSON shape as streamfer's: ``id``, ``key``, ``outputs``, ``model``, ``request_ts_ms``)
and serves delivery reports with ``poll(0)``. Every ``COMMIT_EVERY_S`` (100 ms) it
flushes the producer and then commits what it consumed asynchronously: at-least-once
without a flush per batch, with none of a worker's dead letters, retries, metrics or
rebalance care. Kafka clients use streamfer's producer settings (with librdkafka's
linger, 5 ms, as a user writing the loop would keep it) and ONNX Runtime one intra-op
thread, so what differs from streamfer is what it leaves out. It prints ``ready: owning
N partitions`` on assignment and stops, flushing, on SIGTERM or SIGINT.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Sequence
from typing import cast

import numpy as np
import orjson
from confluent_kafka import KafkaException, Message

from benchmarks.hand_written import (
    Loop,
    loop_parser,
    produce_retrying,
    result_value,
    stop_on_signals,
)

__all__ = ["COMMIT_EVERY_S", "CONSUME_WAIT_S", "main"]

CONSUME_WAIT_S = 0.01
COMMIT_EVERY_S = 0.1


def main(argv: Sequence[str] | None = None) -> int:
    parser = loop_parser("python -m benchmarks.batch_loop")
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args(argv)
    stop = stop_on_signals()
    loop = Loop.open(args)
    producer, consumer, topic = loop.producer, loop.consumer, args.result_topic
    committed_at = time.monotonic()
    try:
        while not stop["now"]:
            batch = [m for m in consumer.consume(args.batch, CONSUME_WAIT_S) if m.error() is None]
            if batch:
                score(loop, batch, topic)
            producer.poll(0)
            now = time.monotonic()
            if now - committed_at >= COMMIT_EVERY_S:  # the position: all produced so far
                committed_at = now
                producer.flush(30)  # delivered first: at-least-once
                with contextlib.suppress(KafkaException):  # nothing new to commit
                    consumer.commit(asynchronous=True)
    finally:
        loop.close()
    return 0


def score(loop: Loop, batch: list[Message], topic: str) -> None:
    """One Redis round trip, one model call and one result produced per record."""
    client, producer, session = loop.client, loop.producer, loop.session
    prefix, suffix, meta = loop.prefix, loop.suffix, loop.meta
    requests = [orjson.loads(m.value() or b"null") for m in batch]
    keys = [f"{prefix}{r['entity']}{suffix}" for r in requests]
    if loop.packed:
        blobs = cast(list[bytes], client.mget(keys))
        rows = np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(batch), -1)
    else:
        pipe = client.pipeline(transaction=False)
        for where in keys:
            pipe.hmget(where, loop.fields)
        values = cast(list[list[bytes]], pipe.execute())
        rows = np.array(values, dtype=np.float64).astype(np.float32)
    labels, scores = session.run(None, {loop.input_name: rows})
    for msg, request, label, scored in zip(
        batch, requests, labels.tolist(), scores.tolist(), strict=True
    ):
        outputs = {"label": label, "scores": scored}
        value = result_value(msg, request["id"], outputs, meta)
        produce_retrying(producer, topic, value, msg.key())


if __name__ == "__main__":
    sys.exit(main())
