"""The Kafka clients replay reads and writes through, without a broker."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import orjson
from confluent_kafka import KafkaError, TopicPartition

from tests.fakes.pipeline import FakeMessage


def _record(
    at: tuple[str, int], offset: int, value: bytes | None, error: KafkaError | None = None
) -> FakeMessage:
    """A record (or, with ``error``, an event) of partition ``at``, keyed by its offset."""
    topic, partition = at
    return FakeMessage(
        value,
        offset,
        key=b"k%d" % offset,
        topic=topic,
        partition=partition,
        ts_ms=1_700_000_000_000 + offset,
        error=error,
    )


class FakeRangeConsumer:
    """A consumer of assigned ranges, as replay reads them: partitions as offset → value
    maps; a partition's log end is ``ends`` (records may be missing below it, as
    transaction markers are). Emits EOF at the log end once; commits are synchronous."""

    def __init__(
        self,
        logs: dict[tuple[str, int], dict[int, bytes]],
        ends: dict[tuple[str, int], int],
    ) -> None:
        self.logs, self.ends = logs, ends
        self.position: dict[tuple[str, int], int] = {}
        self.paused: set[tuple[str, int]] = set()
        self.commits: list[dict[tuple[str, int], int]] = []
        self.stored: dict[tuple[str, int], int] = {}
        self.consumed = 0
        self.on_consume: Callable[[FakeRangeConsumer], None] | None = None

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.position = {(tp.topic, tp.partition): tp.offset for tp in partitions}

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in partitions}

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        out: list[Any] = []
        for key in sorted(self.position):
            if key in self.paused:
                continue
            pos = self.position[key]
            while len(out) < num_messages and pos < self.ends[key]:
                if pos in self.logs[key]:
                    out.append(_record(key, pos, self.logs[key][pos]))
                pos += 1
            if pos >= self.ends[key] and self.position[key] < pos and len(out) < num_messages:
                out.append(_record(key, pos, None, KafkaError(-191)))
            self.position[key] = pos
        self.consumed += 1
        if self.on_consume is not None:
            self.on_consume(self)
        return out

    def store_offsets(self, *, offsets: list[TopicPartition]) -> None:
        for tp in offsets:
            self.stored[(tp.topic, tp.partition)] = tp.offset

    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: bool
    ) -> list[TopicPartition] | None:
        assert asynchronous is False, "replay checkpoints synchronously"
        self.commits.append({(tp.topic, tp.partition): tp.offset for tp in offsets})
        return None

    def committed(self) -> dict[tuple[str, int], int]:
        merged: dict[tuple[str, int], int] = {}
        for c in self.commits:
            merged.update(c)
        return merged


class FakeProducer:
    """Delivers on ``poll`` (from any thread, as the worker's stages poll too); a result
    whose request id is in ``fail`` is refused with ``error``."""

    def __init__(self, fail: set[str] | None = None, error: int = KafkaError.MSG_SIZE_TOO_LARGE):
        self.pending: list[tuple[str, bytes, bytes | None, list[Any], Any]] = []
        self.delivered: list[tuple[str, bytes, list[Any]]] = []
        self.fail = fail or set()
        self.error = error
        self._lock = threading.Lock()

    def produce(
        self, topic: str, value: bytes, key: bytes | None, *, headers: Any, on_delivery: Any
    ) -> None:
        with self._lock:
            self.pending.append((topic, value, key, headers, on_delivery))

    def poll(self, timeout: float = 0) -> int:
        with self._lock:
            done, self.pending = self.pending, []
        for topic, value, key, headers, callback in done:
            doc = orjson.loads(value)
            refused = topic == "res.replay.1" and doc.get("id") in self.fail
            err = KafkaError(self.error) if refused else None
            callback(err, FakeMessage(value, 0, key=key, topic=topic))
            if err is None:
                with self._lock:
                    self.delivered.append((topic, value, headers))
        return len(done)

    def flush(self, timeout: float = 0) -> int:
        self.poll()
        return 0

    def __len__(self) -> int:
        return len(self.pending)
