"""What the hand-written baselines (``naive``, ``batch_loop``, ``passthrough``) share:
their command line, their stop flag, their clients and their result, so that only the
loops differ."""

from __future__ import annotations

import argparse
import signal
from dataclasses import dataclass
from types import FrameType
from typing import Any

import orjson
import redis
from confluent_kafka import Consumer, Message, Producer, TopicPartition

from benchmarks.session import load_session

__all__ = [
    "Loop",
    "forward",
    "loop_parser",
    "produce_retrying",
    "producer_settings",
    "relay_parser",
    "result_value",
    "stop_on_signals",
    "subscribed_consumer",
]


def producer_settings(bootstrap: str) -> dict[str, Any]:
    """streamfer's producer settings, for a like-for-like baseline, with librdkafka's
    default linger (5 ms) that a user writing the loop would keep."""
    return {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "compression.type": "lz4",
    }


def relay_parser(prog: str) -> argparse.ArgumentParser:
    """The options of a loop that only moves records from one topic to another."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--request-topic", required=True)
    parser.add_argument("--result-topic", required=True)
    parser.add_argument("--group", required=True)
    return parser


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


@dataclass(frozen=True)
class Loop:
    """A scoring loop's parts, opened from ``loop_parser``'s arguments."""

    fields: list[str]
    session: Any
    input_name: str
    meta: dict[str, str]
    client: redis.Redis
    producer: Producer
    consumer: Consumer
    prefix: str
    suffix: str
    packed: bool

    @classmethod
    def open(cls, args: argparse.Namespace) -> Loop:
        session, input_name = load_session(args.model)
        prefix, suffix = args.key_template.split("{entity}", 1)
        return cls(
            fields=args.fields.split(","),
            session=session,
            input_name=input_name,
            meta={"name": args.model_name, "version": "1"},
            client=redis.Redis.from_url(args.redis_url),
            producer=Producer(producer_settings(args.bootstrap)),
            consumer=subscribed_consumer(args.bootstrap, args.group, args.request_topic),
            prefix=prefix,
            suffix=suffix,
            packed=args.layout == "packed",
        )

    def close(self) -> None:
        self.producer.flush(30)
        self.consumer.close()
        self.client.close()


def result_value(msg: Message, request_id: str, outputs: Any, meta: dict[str, str]) -> bytes:
    """streamfer's result JSON for the request ``msg`` carried, so one reader measures all."""
    key = msg.key()
    return orjson.dumps(
        {
            "id": request_id,
            "key": key.decode() if key is not None else None,
            "outputs": outputs,
            "model": meta,
            "request_ts_ms": msg.timestamp()[1],
        }
    )


def produce_retrying(
    producer: Producer,
    topic: str,
    value: bytes | None,
    key: bytes | None,
    headers: list[tuple[str, str | bytes | None]] | None = None,
) -> None:
    """Produce, serving deliveries while the local queue is full."""
    while True:
        try:
            producer.produce(topic, value, key, headers=headers)
            return
        except BufferError:
            producer.poll(0.05)


def forward(producer: Producer, topic: str, msg: Message) -> None:
    """Produce a request's bytes unchanged, its produce timestamp as a ``request_ts_ms``
    header, so the common reader measures a relay like any contender."""
    ts = b"%d" % msg.timestamp()[1]
    produce_retrying(producer, topic, msg.value(), msg.key(), [("request_ts_ms", ts)])
