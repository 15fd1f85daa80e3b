"""Workers on three Kafka brokers (replication factor 3, min.insync.replicas 2) under
steady load through broker faults: the fault harness's ``cluster-*`` scenarios.

At-least-once: the broker leading most request partitions is SIGKILLed, then the group
coordinator's broker is restarted. Exactly-once: the group coordinator's broker (a leader
of request partitions too) is SIGKILLed, so every static member's session times out and
librdkafka fences it (``worker.errors.MemberFenced``): each such worker starts again in
place by itself; then the new coordinator's broker is restarted. A read_committed reader
sees every result once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from benchmarks import chaos
from streamfer_dev.kafka_cluster import KafkaCluster

pytestmark = pytest.mark.integration

SERVED_AGAIN_BOUND_S = 75.0
"""A killed leader's partitions wait until the controller fences it (the broker session
timeout, 9 s) and the workers' clients refresh their metadata; a restarted coordinator
moves the group to another broker, whose members rejoin within a session timeout (6 s).
Measured after a leader kill: 27-46 s at load 10 on two cores, once past 60 s at load 40
(1 of 12 runs); past this, a partition was stuck."""

EXACTLY_ONCE_SERVED_AGAIN_BOUND_S = 80.0
"""Exactly-once, the coordinator's broker killed: librdkafka can wait for good in
``send_offsets_to_transaction`` then, and the worker gives the call up 40 s after it was
made (its 30 s timeout and a 10 s margin), starts again in place (1 s backoff, about
10 s to start on two busy cores) and rejoins within a session timeout (6 s); the fenced
members start again at once. Past this, a partition was stuck."""


@pytest.fixture(scope="module")
def env(kafka_cluster: KafkaCluster) -> Iterator[chaos.Env]:
    with chaos.Env.start(kafka=kafka_cluster) as e:
        yield e


@pytest.fixture(autouse=True)
def no_worker_left_behind() -> Iterator[None]:
    yield
    while chaos._LIVE:
        chaos._LIVE.pop().kill()


def _assert_whole(
    report: dict[str, object], faults: int, bound_s: float = SERVED_AGAIN_BOUND_S
) -> None:
    assert report["lost"] == 0, report
    assert report["dead_letters"] == 0, report
    assert not report["stalled_partitions"], report
    assert report["committed_at_end"] is True, report
    served = report["served_again_s"]
    assert isinstance(served, list) and len(served) == faults, report
    # None: the sampler got no figure (its own reads failed); the stall check still holds
    assert all(s is None or s < bound_s for s in served), report
    # the workers' real logs: each broker outage is a warning, no refused connection an error
    assert report["connection_errors_logged"] == 0, report
    assert isinstance(report["outage_warnings"], int) and report["outage_warnings"] >= 1, report


@pytest.mark.timeout(600)
def test_at_least_once_rides_out_a_leader_kill_and_a_coordinator_restart(
    env: chaos.Env,
) -> None:
    report = chaos.broker_failover_scenario(env, 3000)
    _assert_whole(report, faults=2)
    assert report["clean_exits"] is True, report


@pytest.mark.timeout(600)
def test_exactly_once_rides_out_a_coordinator_kill_and_a_coordinator_restart(
    env: chaos.Env,
) -> None:
    report = chaos.broker_failover_scenario(
        env,
        2000,
        exactly_once=True,
        kill_coordinator=True,
        name="cluster-coordinator-kill-eos",
    )
    _assert_whole(report, faults=2, bound_s=EXACTLY_ONCE_SERVED_AGAIN_BOUND_S)
    assert report["duplicates"] == 0, report
    # nobody restarts the workers: a fenced one started again in place, and all stop cleanly
    assert report["clean_exits"] is True, report
