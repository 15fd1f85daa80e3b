"""The two-hop floor: re-produce each record the moment it arrives; no Redis, no model.

``python -m benchmarks.relay --bootstrap B --request-topic T --result-topic R --group G``
polls one record at a time and produces its bytes at once with ``linger.ms`` 0, serves
delivery reports without waiting, and commits asynchronously every 100 ms. Its latency
is what the two Kafka hops of a request-to-result path cost on this broker and machine:
no contender that enriches and scores can beat it. The request's produce timestamp
rides along as a ``request_ts_ms`` header, so the common reader measures it. It prints
``ready: owning N partitions`` on assignment and stops, flushing, on SIGTERM or SIGINT.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Sequence

from confluent_kafka import KafkaException, Producer

from benchmarks.hand_written import (
    forward,
    producer_settings,
    relay_parser,
    stop_on_signals,
    subscribed_consumer,
)

__all__ = ["COMMIT_EVERY_S", "main"]

COMMIT_EVERY_S = 0.1


def main(argv: Sequence[str] | None = None) -> int:
    parser = relay_parser("python -m benchmarks.relay")
    args = parser.parse_args(argv)
    stop = stop_on_signals()
    producer = Producer({**producer_settings(args.bootstrap), "linger.ms": 0})
    consumer = subscribed_consumer(args.bootstrap, args.group, args.request_topic)
    topic = args.result_topic
    committed_at = time.monotonic()
    try:
        while not stop["now"]:
            msg = consumer.poll(0.05)
            if msg is not None and msg.error() is None:
                forward(producer, topic, msg)
            producer.poll(0)
            now = time.monotonic()
            if now - committed_at >= COMMIT_EVERY_S:
                committed_at = now
                with contextlib.suppress(KafkaException):  # nothing new to commit
                    consumer.commit(asynchronous=True)
    finally:
        producer.flush(30)
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
