"""The naive baseline: the per-record loop most first versions of such a service are.

``python -m benchmarks.naive --bootstrap B --redis-url U --model M --fields f0,f1,...
--request-topic T --result-topic R --group G [--layout hash|packed]`` polls one message,
HMGETs its entity's hash (or GETs its packed float32 vector), runs ONNX Runtime on that
one row, produces the result (the same JSON shape as streamfer's: ``id``, ``key``,
``outputs``, ``model``, ``request_ts_ms``) and commits that record's offset
synchronously, one record at a time. Kafka clients use streamfer's producer settings
(idempotent, acks=all, lz4; librdkafka's linger, 5 ms) and ONNX Runtime one intra-op thread, so only
the shape of the loop differs. It prints ``ready: owning N partitions`` on assignment and
stops, flushing, on SIGTERM or SIGINT.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import cast

import numpy as np
import orjson

from benchmarks.hand_written import Loop, loop_parser, result_value, stop_on_signals

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    args = loop_parser("python -m benchmarks.naive").parse_args(argv)
    stop = stop_on_signals()
    loop = Loop.open(args)
    client, producer, consumer = loop.client, loop.producer, loop.consumer
    try:
        while not stop["now"]:
            msg = consumer.poll(0.1)
            if msg is None or msg.error() is not None:
                continue
            request = orjson.loads(msg.value() or b"null")
            where = f"{loop.prefix}{request['entity']}{loop.suffix}"
            if loop.packed:
                blob = cast(bytes, client.get(where))
                row = np.frombuffer(blob, dtype="<f4").reshape(1, -1)
            else:
                values = cast(list[bytes], client.hmget(where, loop.fields))
                row = np.array([[float(v) for v in values]], dtype=np.float32)
            label, scores = loop.session.run(None, {loop.input_name: row})
            outputs = {"label": int(label[0]), "scores": scores[0].tolist()}
            # the result's key is the request's
            producer.produce(
                args.result_topic, result_value(msg, request["id"], outputs, loop.meta), msg.key()
            )
            producer.poll(0)
            consumer.commit(message=msg, asynchronous=False)
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
