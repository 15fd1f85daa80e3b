"""Record limits: the smaller of the producer's and the topic's, less the framing; and
the compacted topics, which take no record without a key."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from worker.config import KafkaSettings
from worker.kafka import limits as limits_module
from worker.kafka.limits import (
    DEFAULT_MESSAGE_MAX_BYTES,
    RECORD_OVERHEAD,
    RecordLimits,
    cap_batch_size,
    record_size,
)


def test_a_topic_takes_the_smaller_of_its_own_and_the_producers_limit() -> None:
    limits = RecordLimits(1_000_000, {"small": 2_000, "large": 8_000_000})
    assert limits("small") == 2_000 - RECORD_OVERHEAD
    assert limits("large") == 1_000_000 - RECORD_OVERHEAD
    assert limits("unread") == 1_000_000 - RECORD_OVERHEAD
    assert limits.smallest() == 2_000 - RECORD_OVERHEAD


def test_without_a_cluster_every_topic_has_librdkafkas_default() -> None:
    assert RecordLimits.unread()("any") == DEFAULT_MESSAGE_MAX_BYTES - RECORD_OVERHEAD


def test_batches_are_capped_at_the_smallest_topic_limit() -> None:
    conf: dict[str, Any] = {}
    cap_batch_size(conf, RecordLimits(1_000_000, {"small": 2_000}))
    assert conf["batch.size"] == 2_000 - RECORD_OVERHEAD


def test_a_smaller_batch_size_of_the_users_is_kept() -> None:
    conf: dict[str, Any] = {"batch.size": 1_000}
    cap_batch_size(conf, RecordLimits(1_000_000, {"small": 2_000}))
    assert conf["batch.size"] == 1_000


def test_a_topic_limit_under_the_framing_still_gives_a_valid_batch_size() -> None:
    conf: dict[str, Any] = {}
    cap_batch_size(conf, RecordLimits(1_000_000, {"tiny": 120}))
    assert conf["batch.size"] == 1


def test_record_size_counts_value_key_and_headers() -> None:
    headers: list[tuple[str, str | bytes | None]] = [("a", b"xyz"), ("bb", None)]
    assert record_size(b"12345", b"kk", headers) == 5 + 2 + (1 + 3) + 2
    assert record_size(None, None, None) == 0


class Entry:
    def __init__(self, value: str | None) -> None:
        self.value = value


class Admin:
    """Answers DescribeConfigs with ``configs`` per topic, or an error for a topic missing
    there; ``refuse``: the whole call raises."""

    def __init__(self, configs: dict[str, dict[str, str]], refuse: bool = False) -> None:
        self._configs = configs
        self._refuse = refuse

    def describe_configs(self, resources: list[Any], request_timeout: float) -> dict[Any, Any]:
        if self._refuse:
            raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
        out: dict[Any, Any] = {}
        for resource in resources:
            future: concurrent.futures.Future[Any] = concurrent.futures.Future()
            config = self._configs.get(resource.name)
            if config is None:
                future.set_exception(KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)))
            else:
                future.set_result({name: Entry(v) for name, v in config.items()})
            out[resource] = future
        return out


def read_with(monkeypatch: pytest.MonkeyPatch, admin: Admin, topics: list[str]) -> RecordLimits:
    monkeypatch.setattr(limits_module, "admin_client", lambda _settings: admin)
    return RecordLimits.read(KafkaSettings(), topics)


def test_compacted_topics_are_read_with_the_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    admin = Admin(
        {
            "res": {"cleanup.policy": "compact", "max.message.bytes": "2000"},
            "both": {"cleanup.policy": "delete, compact"},
            "dlq": {"cleanup.policy": "delete"},
        }
    )
    limits = read_with(monkeypatch, admin, ["res", "both", "dlq", "gone"])
    assert limits.compacted == {"res", "both"}
    assert limits.needs_key("res") and not limits.needs_key("dlq")
    assert not limits.needs_key("gone"), "unreadable: sent, the broker's refusal is the fallback"
    assert limits("res") == 2_000 - RECORD_OVERHEAD


def test_refused_describe_configs_leaves_every_topic_as_today(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    limits = read_with(monkeypatch, Admin({}, refuse=True), ["res", "dlq"])
    assert limits.compacted == frozenset()
    (warning,) = [r for r in caplog.records if r.name == "worker.kafka.limits"]
    assert "not held back from compacted topics" in warning.getMessage()
