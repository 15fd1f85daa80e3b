"""Kafka client log lines: one of a kind per window, with a count of those held back."""

from __future__ import annotations

import logging

import pytest

from worker.kafka.client_logs import KAFKA_LOG, RepeatFilter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _record(message: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord("streamfer.kafka", level, __file__, 1, message, (), None)


def test_repeats_differing_only_in_numbers_pass_once_per_window() -> None:
    clock = Clock()
    repeats = RepeatFilter(window_s=30.0, clock=clock)
    line = "127.0.0.1:{}/bootstrap: Connect failed: Connection refused (after {}ms in CONNECT)"
    passed = []
    for i in range(600):  # one every 50 ms for 30 s, as librdkafka does
        clock.now = i * 0.05
        record = _record(line.format(9000 + i % 3, i % 7))
        if repeats.filter(record):
            passed.append(record.getMessage())
    assert len(passed) == 1
    clock.now = 30.0
    record = _record(line.format(9001, 0))
    assert repeats.filter(record)
    assert record.getMessage().endswith("(599 more like it in the last 30s)")
    assert repeats.filter(_record("another kind of line"))
    assert repeats.filter(_record(line.format(1, 1), level=logging.WARNING))  # another level


def test_every_kafka_client_logs_through_the_filtered_logger(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from worker.config import KafkaSettings
    from worker.kafka.admin import admin_client
    from worker.kafka.sink import producer_config
    from worker.kafka.source import consumer_config
    from worker.tools.offsets import lookup_consumer_config

    settings = KafkaSettings()
    assert producer_config(settings)["logger"] is KAFKA_LOG
    assert consumer_config(settings)["logger"] is KAFKA_LOG
    assert lookup_consumer_config(settings, "g")["logger"] is KAFKA_LOG
    assert any(isinstance(f, RepeatFilter) for f in KAFKA_LOG.filters)
    admin_client(settings)  # takes the logger without complaint
