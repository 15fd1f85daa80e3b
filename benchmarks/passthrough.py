"""The Kafka ceiling: consume a batch, produce the same bytes, commit; no Redis, no model.

``python -m benchmarks.passthrough --bootstrap B --request-topic T --result-topic R
--group G [--batch 256]`` is the fastest a Python consumer-producer can move these
records on this broker: ``consume(batch)``, one ``produce`` per record with the request's
value and key unchanged (its produce timestamp rides along as a ``request_ts_ms`` header,
so the common reader can measure latency), then an asynchronous commit of the batch.
The producer has streamfer's settings. It prints ``ready: owning N partitions`` on
assignment and stops, flushing, on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from confluent_kafka import Producer

from benchmarks.hand_written import (
    produce_retrying,
    producer_settings,
    stop_on_signals,
    subscribed_consumer,
)

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.passthrough")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--request-topic", required=True)
    parser.add_argument("--result-topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args(argv)
    stop = stop_on_signals()
    producer = Producer(producer_settings(args.bootstrap))
    consumer = subscribed_consumer(args.bootstrap, args.group, args.request_topic)
    topic = args.result_topic
    try:
        while not stop["now"]:
            batch = consumer.consume(args.batch, 0.1)
            if not batch:
                producer.poll(0)
                continue
            for msg in batch:
                if msg.error() is not None:
                    continue
                ts = b"%d" % msg.timestamp()[1]
                produce_retrying(producer, topic, msg.value(), msg.key(), [("request_ts_ms", ts)])
            producer.poll(0)
            consumer.commit(asynchronous=True)
    finally:
        producer.flush(30)
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
