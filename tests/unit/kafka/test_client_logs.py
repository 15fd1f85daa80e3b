"""Kafka client log lines: one of a kind per window, with a count of those held back."""

from __future__ import annotations

import logging

import pytest

from tests.fakes.clock import FakeClock
from worker.kafka.client_logs import (
    BROKER_OUTAGES,
    KAFKA_LOG,
    BrokerOutages,
    RepeatFilter,
    TransactionErrors,
)


def _record(message: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord("streamfer.kafka", level, __file__, 1, message, (), None)


def test_repeats_differing_only_in_numbers_pass_once_per_window() -> None:
    clock = FakeClock(0.0)
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


def test_debug_lines_all_pass_for_a_debugging_reader() -> None:
    clock = FakeClock(0.0)
    repeats = RepeatFilter(window_s=30.0, clock=clock)
    line = "FETCH [rdkafka#consumer-1] [thrd:127.0.0.1:9092/1]: Fetch topic t [{}] at offset {}"
    passed = 0
    for i in range(50):
        clock.now = i * 0.1
        passed += repeats.filter(_record(line.format(i % 4, i), level=logging.DEBUG))
    assert passed == 50
    assert repeats.filter(_record(line.format(0, 0), level=logging.INFO))
    assert not repeats.filter(_record(line.format(1, 1), level=logging.INFO))


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


def _librdkafka(buf: str, level: int = logging.ERROR, fac: str = "FAIL") -> logging.LogRecord:
    """A record as confluent-kafka's log callback makes it."""
    return logging.LogRecord(
        "streamfer.kafka", level, __file__, 1, "%s [%s] %s", (fac, "rdkafka#consumer-1", buf), None
    )


REFUSED = (
    "127.0.0.1:{port}/{id}: Connect to ipv4#127.0.0.1:{port} failed: Connection refused "
    "(after 0ms in state CONNECT)"
)


def test_a_broker_restart_is_one_warning_and_one_line_when_it_is_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(0.0)
    outages = BrokerOutages(remind_s=60.0, clock=clock)
    passed = []
    lines = [
        _librdkafka("127.0.0.1:9093/2: Disconnected: connection closed by peer", logging.INFO),
        _librdkafka(REFUSED.format(port=9093, id=2)),
        _record("kafka: " + REFUSED.format(port=9093, id=2)),  # the error callback's
        _librdkafka(REFUSED.format(port=9093, id="bootstrap")),  # the same broker
        _librdkafka(
            "GroupCoordinator: 127.0.0.1:9093: Connect to ipv4#127.0.0.1:9093 failed: "
            "Connection refused (after 0ms in state CONNECT)"
        ),
        _record("producer error: 127.0.0.1:9093/2: Disconnected (after 12ms in state UP)"),
        # the coordinator's connection before librdkafka knows which broker it is
        _librdkafka(
            "[thrd:GroupCoordinator]: GroupCoordinator: Connect to ipv4#127.0.0.1:9093 "
            "failed: Connection refused (after 0ms in state CONNECT)"
        ),
        _record(
            "kafka: GroupCoordinator: Connect to ipv4#127.0.0.1:9093 failed: Connection "
            "refused (after 0ms in state CONNECT)"
        ),
    ]
    for i in range(200):  # 10 s of a restart, a line every 50 ms: 25 INFO, 175 errors
        clock.now = i * 0.05
        record = lines[i % len(lines)]
        if outages.filter(record):
            passed.append((record.levelname, record.getMessage()))
    assert [level for level, _ in passed if level != "INFO"] == ["WARNING"]
    (warning,) = [m for level, m in passed if level == "WARNING"]
    assert warning.startswith("Kafka broker 127.0.0.1:9093 is unreachable (FAIL [rdkafka#")
    assert "held back until it is up again" in warning

    clock.now = 14.0
    with caplog.at_level(logging.WARNING, logger="streamfer.kafka"):
        outages.seen({"127.0.0.1:9092/1": {"state": "UP"}, "127.0.0.1:9093/2": {"state": "INIT"}})
        assert caplog.messages == []  # not up yet
        outages.seen({"127.0.0.1:9093/2": {"state": "UP"}, "GroupCoordinator": {"state": "UP"}})
        outages.seen({"127.0.0.1:9093/2": {"state": "UP"}})  # said once
    assert caplog.messages == [
        "Kafka broker 127.0.0.1:9093 is up again after 14s (174 connection errors held back)"
    ]
    again = _librdkafka(REFUSED.format(port=9093, id=2))
    assert outages.filter(again) and again.levelname == "WARNING"  # a new outage


def test_real_errors_about_a_broker_stay_errors_and_each_broker_has_its_own_outage() -> None:
    outages = BrokerOutages(clock=FakeClock(0.0))
    for buf in (
        "127.0.0.1:9094/bootstrap: SSL handshake failed: certificate verify failed",
        "127.0.0.1:9094/1: SASL authentication error: Authentication failed (after 3ms)",
        "3/3 brokers are down",
        "Topic req partition count changed",
    ):
        record = _librdkafka(buf)
        assert outages.filter(record) and record.levelname == "ERROR"
        assert outages.filter(record := _librdkafka(buf)) and record.levelname == "ERROR"
    first = _librdkafka(REFUSED.format(port=9093, id=2))
    other = _librdkafka(REFUSED.format(port=9095, id=3))
    assert outages.filter(first) and outages.filter(other)
    assert "127.0.0.1:9095" in other.getMessage() and other.levelname == "WARNING"
    assert not outages.filter(_librdkafka(REFUSED.format(port=9095, id=3)))


def test_a_long_outage_is_recalled_once_a_minute_with_what_was_held_back() -> None:
    clock = FakeClock(0.0)
    outages = BrokerOutages(remind_s=60.0, clock=clock)
    passed = []
    for i in range(2400):  # 120 s, every 50 ms
        clock.now = i * 0.05
        record = _librdkafka(REFUSED.format(port=9093, id=2))
        if outages.filter(record):
            passed.append(record.getMessage())
    assert len(passed) == 2
    assert passed[1].startswith(
        "Kafka broker 127.0.0.1:9093 still unreachable after 60s (1199 connection errors held back)"
    )


def test_the_kafka_logger_filters_outages_before_repeats() -> None:
    kinds = [type(f) for f in KAFKA_LOG.filters]
    assert kinds.index(BrokerOutages) < kinds.index(RepeatFilter)
    assert BROKER_OUTAGES in KAFKA_LOG.filters


def test_errors_after_a_quiet_spell_are_a_new_outage() -> None:
    """A broker no client reconnects to after its restart never shows UP in statistics;
    its next failure must still be told, not held back as part of the old one."""
    clock = FakeClock(0.0)
    outages = BrokerOutages(remind_s=60.0, quiet_s=30.0, clock=clock)
    assert outages.filter(_librdkafka(REFUSED.format(port=9093, id=2)))
    clock.now = 29.0
    assert not outages.filter(_librdkafka(REFUSED.format(port=9093, id=2)))
    clock.now = 58.0  # 29 s after the last error about it
    assert not outages.filter(_librdkafka(REFUSED.format(port=9093, id=2)))
    clock.now = 90.0
    record = _librdkafka(REFUSED.format(port=9093, id=2))
    assert outages.filter(record)
    assert record.getMessage().startswith("Kafka broker 127.0.0.1:9093 is unreachable (")


def test_a_failed_transaction_is_a_warning_and_other_errors_stay_errors() -> None:
    """The worker reports a failed transaction itself, with the abort and rewind it does;
    librdkafka's own line about it is no error for an operator to chase."""
    transactions = TransactionErrors()
    failed = _librdkafka(
        "Current transaction failed in state InTransaction: Failed to commit offsets to "
        "transaction on broker 127.0.0.1:9093/2: ILLEGAL_GENERATION (requires epoch bump)",
        fac="TXNERR",
    )
    refused = _librdkafka(
        "TxnCoordinator/3: Failed to add offsets to transaction on broker TxnCoordinator/3: "
        "Broker: Not coordinator",
        fac="ADDOFFSETS",
    )
    fatal = _librdkafka("Fatal error: Broker: Producer fenced", fac="FATAL")
    for record in (failed, refused, fatal):
        assert transactions.filter(record)
    assert [r.levelname for r in (failed, refused, fatal)] == ["WARNING", "WARNING", "ERROR"]
    assert TransactionErrors in [type(f) for f in KAFKA_LOG.filters]
