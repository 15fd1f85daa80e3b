"""Network faults through a real toxiproxy between real workers and a real Kafka: the
short variant of ``python -m benchmarks.chaos --scenario net`` (``benchmarks.netfaults``).

It needs Go the first time (toxiproxy is built from source into the tool cache) and
skips only when Go is missing and no build is cached."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator

import pytest

from benchmarks import chaos
from streamfer_dev.toxiproxy import toxiproxy_binary
from worker.errors import StackError

pytestmark = pytest.mark.integration


@pytest.fixture
def env() -> Iterator[chaos.Env]:
    try:
        toxiproxy_binary()
    except StackError:
        if shutil.which("go") is None:
            pytest.skip("toxiproxy is built with Go, and 'go' is not installed")
        raise
    with chaos.Env.start(net=True) as e:
        yield e
    while chaos._LIVE:
        chaos._LIVE.pop().kill()


def test_latency_then_the_broker_down_lose_nothing_and_the_group_serves_again(
    env: chaos.Env,
) -> None:
    latency = dataclasses.replace(chaos.NET_FAULTS["latency"], duration_s=3)
    down = dataclasses.replace(chaos.NET_FAULTS["broker-down"], duration_s=5)
    report = chaos.net_scenario(
        env, 2000, faults=(latency, down), exactly_once=False, name="net-short"
    )
    assert report["unmet"] == [], report
    assert chaos.complete(report), report
    assert [r["fault"] for r in report["recoveries"]] == ["latency", "broker-down"]
    # the workers reach the broker only through the proxy, so the outage refused them
    assert report["refused_connections_logged"] > 0, report
