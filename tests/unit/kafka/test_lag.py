"""LagStats: lag per owned partition and seconds to drain, from librdkafka statistics."""

from __future__ import annotations

import orjson
from prometheus_client import CollectorRegistry

from worker.compose import Metrics
from worker.kafka.lag import LagStats


def stats(lags: dict[tuple[str, int], int], broker_state: str = "UP") -> str:
    topics: dict[str, dict[str, dict[str, dict[str, int]]]] = {}
    for (topic, part), lag in lags.items():
        topics.setdefault(topic, {"partitions": {}})["partitions"][str(part)] = {
            "consumer_lag": lag
        }
    topics.setdefault("req", {"partitions": {}})["partitions"]["-1"] = {"consumer_lag": -1}
    return orjson.dumps({"brokers": {"b1": {"state": broker_state}}, "topics": topics}).decode()


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_lag_of_owned_partitions_and_seconds_to_drain() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    now = [0.0]
    lag = LagStats(metrics.consumer_lag, metrics.seconds_to_drain, clock=lambda: now[0])
    lag.consumed(1000)
    now[0] = 10.0  # 100 records/s
    up = lag.update(
        stats({("req", 0): 300, ("req", 1): 200, ("req", 2): 999}), {("req", 0), ("req", 1)}
    )
    assert up is True
    assert value(registry, "streamfer_consumer_lag", topic="req", partition="0") == 300
    assert value(registry, "streamfer_consumer_lag", topic="req", partition="2") is None
    assert value(registry, "streamfer_seconds_to_drain") == 5.0  # 500 records at 100/s
    lag.forget({("req", 0)})
    assert value(registry, "streamfer_consumer_lag", topic="req", partition="0") is None


def test_no_consumption_yet_means_an_infinite_drain_and_no_lag_means_zero() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    now = [0.0]
    lag = LagStats(metrics.consumer_lag, metrics.seconds_to_drain, clock=lambda: now[0])
    now[0] = 5.0
    assert lag.update(stats({("req", 0): 10}, broker_state="DOWN"), {("req", 0)}) is False
    assert value(registry, "streamfer_seconds_to_drain") == float("inf")
    now[0] = 6.0
    lag.update(stats({("req", 0): 0}), {("req", 0)})
    assert value(registry, "streamfer_seconds_to_drain") == 0.0
