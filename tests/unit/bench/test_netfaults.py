"""The fault harness's network faults: definitions, bounds and the recovery measurement
(``benchmarks.netfaults``), with a fake proxy and a fake clock."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import netfaults
from benchmarks.cluster_faults import stall_bound_s
from benchmarks.netfaults import apply, heal, net_faults, recovery_bound_s, served, unmet
from streamfer_dev.toxiproxy import Toxic
from worker.kafka.call_watch import CALL_TIMEOUT_S, STALL_MARGIN_S

FAULTS = net_faults(6.0)


class FakeProxies:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def set_enabled(self, proxy: str, enabled: bool) -> None:
        self.calls.append(("enabled", proxy, str(enabled)))

    def add(self, proxy: str, toxic: Toxic) -> None:
        self.calls.append(("add", proxy, toxic.name, toxic.kind, toxic.stream))

    def remove(self, proxy: str, toxic: str) -> None:
        self.calls.append(("remove", proxy, toxic))


def test_the_faults_the_harness_promises_exist_on_the_right_proxy() -> None:
    assert {name: f.target for name, f in FAULTS.items()} == {
        "latency": "kafka",
        "broker-down": "kafka",
        "black-hole": "kafka",
        "bandwidth": "kafka",
        "sliced": "kafka",
        "redis-down": "redis",
        "redis-reset": "redis",
    }
    assert FAULTS["black-hole"].duration_s > 6.0  # longer than the session timeout
    assert {t.kind for t in FAULTS["black-hole"].toxics} == {"timeout"}
    assert [f.name for f in FAULTS.values() if f.cuts_kafka] == ["broker-down", "black-hole"]


def test_a_down_fault_disables_its_proxy_and_a_toxic_fault_adds_and_removes_toxics() -> None:
    proxies = FakeProxies()
    apply(proxies, FAULTS["broker-down"])
    heal(proxies, FAULTS["broker-down"])
    assert proxies.calls == [("enabled", "kafka", "False"), ("enabled", "kafka", "True")]
    proxies.calls.clear()
    apply(proxies, FAULTS["latency"])
    heal(proxies, FAULTS["latency"])
    assert proxies.calls == [
        ("add", "kafka", "latency-upstream", "latency", "upstream"),
        ("add", "kafka", "latency-downstream", "latency", "downstream"),
        ("remove", "kafka", "latency-upstream"),
        ("remove", "kafka", "latency-downstream"),
    ]
    assert Toxic("t", "latency", {"latency": 5}).body() == {
        "name": "t",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 1.0,
        "attributes": {"latency": 5},
    }


def test_the_bound_is_a_session_timeout_plus_settling_unless_a_call_can_wedge() -> None:
    plain = 6.0 + netfaults.SETTLE_S
    for fault in FAULTS.values():
        assert recovery_bound_s(fault, exactly_once=False, session_timeout_s=6.0) == plain
    assert recovery_bound_s(FAULTS["latency"], exactly_once=True, session_timeout_s=6.0) == plain
    wedged = CALL_TIMEOUT_S + STALL_MARGIN_S + netfaults.RESTART_S + netfaults.COVERAGE_S
    for name in ("broker-down", "black-hole"):
        assert recovery_bound_s(FAULTS[name], exactly_once=True, session_timeout_s=6.0) == wedged


@pytest.mark.parametrize(
    ("committed", "ends", "ok"),
    [
        ({0: 10, 1: 20}, {0: 50, 1: 50}, False),  # neither moved
        ({0: 11, 1: 20}, {0: 50, 1: 50}, False),  # one moved
        ({0: 11, 1: 21}, {0: 50, 1: 50}, True),
        ({0: 10, 1: 21}, {0: 10, 1: 50}, True),  # partition 0 sits at its log end
        ({0: -1, 1: 21}, {0: 0, 1: 50}, True),  # partition 0 never had a record
    ],
)
def test_served_means_every_partition_moved_or_is_at_its_log_end(
    committed: dict[int, int], ends: dict[int, int], ok: bool
) -> None:
    assert served({0: 10, 1: 20}, committed, ends) is ok


def test_wait_recovered_counts_from_the_call_until_every_partition_moved() -> None:
    now = [0.0]
    samples = iter(
        [
            ({0: 5, 1: 5}, {0: 9, 1: 9}),  # the baseline, as the fault heals
            ({0: 5, 1: 5}, {0: 9, 1: 9}),
            ({0: 7, 1: 5}, {0: 9, 1: 9}),
            ({0: 7, 1: 6}, {0: 9, 1: 9}),
        ]
    )

    def sleep(s: float) -> None:
        now[0] += s

    got = netfaults.wait_recovered(lambda: next(samples), 60, clock=lambda: now[0], sleep=sleep)
    assert got == 1.0
    stuck = netfaults.wait_recovered(lambda: ({0: 5}, {0: 9}), 3, clock=lambda: now[0], sleep=sleep)
    assert stuck is None


def report(*took: float | None, **kw: Any) -> dict[str, Any]:
    recoveries = [{"fault": "latency", "recovery_s": t, "bound_s": 12.0} for t in took or [3.0]]
    return {"lost": 0, "dead_letters": 0, "duplicates": 0, "recoveries": recoveries, **kw}


def test_unmet_names_each_missed_expectation() -> None:
    assert unmet(report(), exactly_once=True) == []
    assert unmet(report(duplicates=4), exactly_once=False) == []
    assert unmet(report(duplicates=4), exactly_once=True) == ["4 duplicates in exactly-once mode"]
    assert unmet(report(None, lost=1, dead_letters=2), exactly_once=False) == [
        "1 lost",
        "2 valid requests dead-lettered",
        "latency: served again never, bound 12 s",
    ]
    assert unmet(report(1.0, 12.5), exactly_once=False) == [
        "latency: served again after 12.5 s, bound 12 s"
    ]


def test_a_worker_that_exited_fails_the_run_unless_the_harness_restarts_workers() -> None:
    exited = {**report(), "worker_exits": [1], "harness_restarts": False}
    assert unmet(exited, exactly_once=True) == ["workers exited by themselves: exit codes [1]"]
    assert unmet({**exited, "harness_restarts": True}, exactly_once=True) == []
    assert unmet({**report(), "worker_exits": []}, exactly_once=True) == []


def test_a_cluster_fault_gives_exactly_once_the_time_a_wedged_call_takes() -> None:
    wedged = CALL_TIMEOUT_S + STALL_MARGIN_S
    assert stall_bound_s(exactly_once=True, session_timeout_s=6.0) > wedged + 10.0, (
        "a call given up 40 s after it began, then a start in place"
    )
    assert stall_bound_s(exactly_once=False, session_timeout_s=6.0) < wedged
