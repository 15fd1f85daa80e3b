"""The competent baseline: the batch loop an experienced user writes by hand.

``python -m benchmarks.batch_loop --bootstrap B --redis-url U --model M --fields f0,...
--request-topic T --result-topic R --group G [--layout hash|packed] [--batch 256]``
consumes up to ``--batch`` records, fetches every record's features in one Redis round
trip (a non-transactional pipeline of HMGETs, or one MGET of packed float32 vectors),
runs ONNX Runtime once on the batch, produces one result per record (the same JSON
shape as streamfer's: ``id``, ``key``, ``outputs``, ``model``, ``request_ts_ms``),
flushes the producer and then commits the batch's offsets: at-least-once, with none of
a worker's dead letters, retries, metrics or rebalance care. Kafka clients use
streamfer's producer settings and ONNX Runtime one intra-op thread, so what differs from
streamfer is what it leaves out. It prints ``ready: owning N partitions`` on assignment
and stops, flushing, on SIGTERM or SIGINT.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import cast

import numpy as np
import orjson

from benchmarks.hand_written import (
    Loop,
    loop_parser,
    produce_retrying,
    result_value,
    stop_on_signals,
)

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = loop_parser("python -m benchmarks.batch_loop")
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args(argv)
    stop = stop_on_signals()
    loop = Loop.open(args)
    client, producer, consumer = loop.client, loop.producer, loop.consumer
    session, input_name, meta = loop.session, loop.input_name, loop.meta
    prefix, suffix, topic = loop.prefix, loop.suffix, args.result_topic
    try:
        while not stop["now"]:
            batch = [m for m in consumer.consume(args.batch, 0.1) if m.error() is None]
            if not batch:
                producer.poll(0)
                continue
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
            labels, scores = session.run(None, {input_name: rows})
            for msg, request, label, score in zip(
                batch, requests, labels.tolist(), scores.tolist(), strict=True
            ):
                outputs = {"label": label, "scores": score}
                value = result_value(msg, request["id"], outputs, meta)
                produce_retrying(producer, topic, value, msg.key())
            producer.flush(30)
            consumer.commit(asynchronous=True)
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
