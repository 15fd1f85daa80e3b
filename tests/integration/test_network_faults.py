"""Network faults through a real toxiproxy between real workers and a real Kafka: the
short variant of ``python -m benchmarks.chaos --scenario net`` (``benchmarks.netfaults``).

It needs Go the first time (toxiproxy is built from source into the tool cache) and
skips only when Go is missing and no build is cached."""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Iterator
from http.client import HTTPException

import pytest

from benchmarks import chaos, netfaults
from streamfer_dev.stack import free_port
from streamfer_dev.toxiproxy import toxiproxy_binary
from tests.integration.helpers import eventually, http_get, scrape_metrics
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


TRANSACTION_TIMEOUT_S = 10
OUTAGE_MAX_S = 60


def test_an_exactly_once_worker_starts_itself_again_after_an_outage_past_its_transaction_timeout(
    env: chaos.Env,
) -> None:
    """One plain ``streamfer run`` (exactly-once, nothing restarts it) loses the broker for
    longer than its transaction timeout, until it recovered (a minute at most): its
    producer is fenced for good once the transaction timed out (or, where librdkafka
    never answers, its call wedges and ``/healthz`` says so). It starts itself again in
    place (same PID) and counts it in ``/metrics``; a read_committed reader then sees
    every result once."""
    run = chaos.Run(env, "net-recover", 1500, exactly_once=True)
    fleet = run.fleet(
        kafka_extra=(
            f'producer_options = {{ "transaction.timeout.ms" = {TRANSACTION_TIMEOUT_S * 1000} }}'
        )
    )
    port = free_port()
    fleet.env = {"STREAMFER_METRICS__HOST": "127.0.0.1", "STREAMFER_METRICS__PORT": str(port)}
    requests, good, _ = run.requests()
    run.start_workers(fleet, 1)
    [worker] = fleet.workers
    pid = worker.pid
    assert set(recoveries(port).values()) == {0.0}
    stream = run.stream(requests, rate=100)
    time.sleep(4)  # results flow, transactions commit
    assert env.proxy is not None
    run.fault()
    netfaults.apply(env.proxy, chaos.NET_FAULTS["broker-down"])
    unhealthy: list[str] = []
    seen: list[object] = []

    def recovered() -> bool:
        try:
            status, body = http_get(port, "/healthz")
        except (OSError, HTTPException) as exc:  # the image is being replaced
            seen.append(exc)
            return False
        if status == 503 and ("stalled" in body or "timeout" in body):
            unhealthy.append(body)
        seen.append(counts := recoveries(port))
        return sum(counts.values()) >= 1.0

    try:
        time.sleep(TRANSACTION_TIMEOUT_S + 8)
        # The broker stays away until the worker gave its producer up: fenced at the
        # transaction timeout, or a call wedged 40 s after it began; a minute at most.
        eventually(recovered, timeout=OUTAGE_MAX_S - TRANSACTION_TIMEOUT_S - 8)
    finally:
        netfaults.heal(env.proxy, chaos.NET_FAULTS["broker-down"])

    assert eventually(recovered, timeout=120), (seen[-3:], worker.log_text()[-4000:])
    if recoveries(port)["call_stalled"]:
        assert unhealthy, "/healthz never said the worker was stuck"
    stream.join()
    assert worker.alive() and worker.pid == pid  # never exited, nobody restarted it
    report = run.report(fleet, good, set())
    assert report["lost"] == 0, report
    assert report["duplicates"] == 0, report
    assert report["dead_letters"] == 0, report
    assert report["committed_at_end"], report
    logs = fleet.logs_text()
    assert logs.count(chaos.RECOVERED_LOGGED) >= 1
    assert "Traceback" not in logs


def recoveries(port: int) -> dict[str, float]:
    """The worker's ``streamfer_recoveries_total`` by reason; none while it does not
    answer (starting again)."""
    try:
        samples = scrape_metrics(port)
    except (OSError, HTTPException):  # cut off as the image is replaced
        return {}
    return {
        dict(labels)["reason"]: value
        for (name, labels), value in samples.items()
        if name == "streamfer_recoveries_total"
    }
