"""What the hand-written baselines (``naive``, ``batch_loop``, ``passthrough``) share:
their command line, their stop flag and their consumer, so that only the loops differ."""

from __future__ import annotations

import argparse
import signal
from types import FrameType
from typing import Any

from confluent_kafka import Consumer, TopicPartition

__all__ = ["loop_parser", "producer_settings", "stop_on_signals", "subscribed_consumer"]


def producer_settings(bootstrap: str) -> dict[str, Any]:
    """streamfer's producer settings, for a like-for-like baseline."""
    return {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "compression.type": "lz4",
    }


def loop_parser(prog: str) -> argparse.ArgumentParser:
    """The options of a loop that enriches from Redis and runs the model."""
    parser = argparse.ArgumentParser(prog=prog)
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
    return parser


def stop_on_signals() -> dict[str, bool]:
    """A flag that SIGTERM or SIGINT sets (``flag["now"]``), for the loop to check."""
    stop = {"now": False}

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


def subscribed_consumer(bootstrap: str, group: str, topic: str) -> Consumer:
    """A manually committing consumer of ``topic`` that prints ``ready: owning N
    partitions`` on assignment (what the benchmark waits for)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )

    def on_assign(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
        print(f"ready: owning {len(partitions)} partitions", flush=True)

    consumer.subscribe([topic], on_assign=on_assign)
    return consumer
