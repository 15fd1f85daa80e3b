"""Source.consume_first: a lone record is returned at once, errors are filtered."""

from __future__ import annotations

from typing import Any, cast

import pytest
from confluent_kafka import Consumer, KafkaError

from worker.errors import SourceError
from worker.source import Source


class Record:
    def __init__(self, offset: int, error: KafkaError | None = None) -> None:
        self.offset = offset
        self._error = error

    def error(self) -> KafkaError | None:
        return self._error


class QueueConsumer:
    """What ``Source`` calls on a consumer, over a list of already fetched records."""

    def __init__(self, records: list[Record]) -> None:
        self.records = records
        self.calls: list[tuple[str, int, float]] = []

    def poll(self, timeout: float) -> Record | None:
        self.calls.append(("poll", 1, timeout))
        return self.records.pop(0) if self.records else None

    def consume(self, num_messages: int, timeout: float) -> list[Record]:
        self.calls.append(("consume", num_messages, timeout))
        taken, self.records = self.records[:num_messages], self.records[num_messages:]
        return taken


def source(records: list[Record]) -> tuple[Source, QueueConsumer]:
    consumer = QueueConsumer(records)
    noop: Any = lambda _parts: None  # noqa: E731
    src = Source(cast(Consumer, consumer), ["t"], on_assign=noop, on_revoke=noop, on_lost=noop)
    return src, consumer


def test_first_record_then_what_is_already_fetched_without_waiting() -> None:
    src, consumer = source([Record(i) for i in range(5)])
    got = src.consume_first(3, 0.5)
    assert [cast(Record, m).offset for m in got] == [0, 1, 2]
    assert consumer.calls == [("poll", 1, 0.5), ("consume", 2, 0)]


def test_nothing_within_the_timeout() -> None:
    src, consumer = source([])
    assert src.consume_first(256, 0.02) == []
    assert consumer.calls == [("poll", 1, 0.02)]


def test_partition_eof_is_dropped_and_fatal_errors_raise() -> None:
    eof = KafkaError(KafkaError._PARTITION_EOF)
    src, _ = source([Record(0, eof), Record(1)])
    assert [cast(Record, m).offset for m in src.consume_first(10, 0.1)] == [1]
    fatal = KafkaError(KafkaError._FATAL, "fenced", fatal=True)
    src, _ = source([Record(0, fatal)])
    with pytest.raises(SourceError, match="fatal consumer error"):
        src.consume_first(10, 0.1)
