"""A share group's configuration at start-up (``worker.kafka.share_group``), the share
consumer's settings, and what its statistics say of the membership (``ShareEvents``)."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from prometheus_client import CollectorRegistry

from worker.compose import Metrics
from worker.config import KafkaSettings
from worker.errors import ConfigError
from worker.kafka.share_group import describe_share_group, prepare_share_group
from worker.kafka.share_source import share_consumer_config
from worker.loop.share_events import ShareEvents
from worker.ops.health import HealthState


@dataclass
class _Entry:
    value: str


@dataclass
class FakeAdmin:
    """Answers describe_configs and incremental_alter_configs of one group."""

    configs: dict[str, str] | None = field(
        default_factory=lambda: {
            "share.auto.offset.reset": "latest",
            "share.delivery.count.limit": "5",
            "share.record.lock.duration.ms": "30000",
            "consumer.session.timeout.ms": "45000",
        }
    )
    may_alter: bool = True
    altered: list[tuple[str, str]] = field(default_factory=list)

    def describe_configs(self, resources: list[Any], request_timeout: float) -> dict[Any, Any]:
        done: Future[Any] = Future()
        if self.configs is None:
            done.set_exception(KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED)))
        else:
            done.set_result({k: _Entry(v) for k, v in self.configs.items()})
        return {resources[0]: done}

    def incremental_alter_configs(
        self, resources: list[Any], request_timeout: float
    ) -> dict[Any, Any]:
        done: Future[Any] = Future()
        if self.may_alter:
            for entry in resources[0].incremental_configs:
                self.altered.append((entry.name, entry.value))
                if self.configs is not None:
                    self.configs[entry.name] = entry.value
            done.set_result(None)
        else:
            done.set_exception(KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED)))
        return {resources[0]: done}


def settings(**kw: Any) -> KafkaSettings:
    return KafkaSettings(group_id="g", share_group=True, **kw)


def test_the_group_is_made_to_start_where_auto_offset_reset_says() -> None:
    admin = FakeAdmin()
    group = prepare_share_group(settings(), admin=admin)
    assert admin.altered == [("share.auto.offset.reset", "earliest")]
    assert (group.delivery_count_limit, group.record_lock_s) == (5, 30.0)
    admin.altered.clear()
    prepare_share_group(settings(), admin=admin)
    assert admin.altered == []  # already so: nothing to change


def test_the_groups_own_limits_are_read() -> None:
    admin = FakeAdmin()
    assert admin.configs is not None
    admin.configs.update(
        {"share.delivery.count.limit": "3", "share.record.lock.duration.ms": "15000"}
    )
    group = prepare_share_group(settings(auto_offset_reset="latest"), admin=admin)
    assert (group.delivery_count_limit, group.record_lock_s) == (3, 15.0)


def test_a_configured_limit_that_differs_from_the_groups_gives_way_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        group = prepare_share_group(settings(share_delivery_count_limit=7), admin=FakeAdmin())
    assert group.delivery_count_limit == 5
    assert "using the group's" in caplog.text


def test_an_earliest_start_that_cannot_be_set_is_refused_naming_the_fix() -> None:
    with pytest.raises(ConfigError) as info:
        prepare_share_group(settings(), admin=FakeAdmin(may_alter=False))
    msg = str(info.value)
    assert 'auto_offset_reset = "earliest"' in msg and "ALTER_CONFIGS" in msg
    assert "--add-config share.auto.offset.reset=earliest" in msg


def test_a_latest_start_that_cannot_be_set_only_warns(caplog: pytest.LogCaptureFixture) -> None:
    admin = FakeAdmin(may_alter=False)
    assert admin.configs is not None
    admin.configs["share.auto.offset.reset"] = "earliest"
    with caplog.at_level(logging.WARNING):
        prepare_share_group(settings(auto_offset_reset="latest"), admin=admin)
    assert "cannot set share group g's share.auto.offset.reset to latest" in caplog.text


def test_an_undescribable_group_falls_back_to_the_configured_limit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    admin = FakeAdmin(configs=None)
    with caplog.at_level(logging.WARNING):
        group = prepare_share_group(settings(share_delivery_count_limit=3), admin=admin)
    assert (group.delivery_count_limit, group.record_lock_s) == (3, 30.0)
    assert admin.altered == [("share.auto.offset.reset", "earliest")]
    assert "could not be read" in caplog.text


def test_a_broker_without_share_groups_is_named() -> None:
    admin = FakeAdmin(configs={"consumer.session.timeout.ms": "45000"})
    with pytest.raises(ConfigError, match="does not serve share groups"):
        describe_share_group(settings(), admin=admin)


def test_the_share_consumer_acknowledges_explicitly_one_poll_of_the_bound() -> None:
    conf = share_consumer_config(
        settings(consumer_options={"fetch.wait.max.ms": 50}), max_poll_records=1024
    )
    assert conf["share.acknowledgement.mode"] == "explicit"
    assert conf["max.poll.records"] == 1024 and conf["group.id"] == "g"
    assert conf["fetch.wait.max.ms"] == 50
    assert "auto.offset.reset" not in conf and "enable.auto.commit" not in conf


def _stats(join_state: str, assigned: int) -> str:
    return orjson.dumps(
        {
            "brokers": {"b": {"state": "UP"}},
            "topics": {},
            "cgrp": {"join_state": join_state, "assignment_size": assigned},
        }
    ).decode()


def test_statistics_show_the_share_membership(caplog: pytest.LogCaptureFixture) -> None:
    health = HealthState()
    metrics = Metrics(CollectorRegistry())
    events = ShareEvents(health, metrics, "g", {"req": "p"})
    events.on_stats(_stats("init", 0))
    assert not health.joined
    with caplog.at_level(logging.INFO):
        events.on_stats(_stats("steady", 1))
    assert health.joined and events.assigned == 1
    assert "; owning 1 partitions" in caplog.text
    assert metrics.registry.get_sample_value("streamfer_assigned_partitions") == 1


def test_refused_acknowledgements_are_counted_per_pipeline() -> None:
    metrics = Metrics(CollectorRegistry())
    events = ShareEvents(HealthState(), metrics, "g", {"req": "p"})
    events.on_acknowledged({TopicPartition("req", 0): {1, 2, 3}}, None)
    events.on_acknowledged({TopicPartition("req", 0): {4, 5}}, KafkaException("lost"))
    value = metrics.registry.get_sample_value(
        "streamfer_share_acknowledgement_errors_total", {"pipeline": "p"}
    )
    assert value == 2
