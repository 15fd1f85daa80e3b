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

import sys
from collections.abc import Sequence

from confluent_kafka import Producer

from benchmarks.hand_written import (
    forward,
    producer_settings,
    relay_parser,
    stop_on_signals,
    subscribed_consumer,
)

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = relay_parser("python -m benchmarks.passthrough")
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
                forward(producer, topic, msg)
            producer.poll(0)
            consumer.commit(asynchronous=True)
    finally:
        producer.flush(30)
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
