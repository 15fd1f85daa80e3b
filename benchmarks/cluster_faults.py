"""What the cluster scenarios of the fault harness do to three Kafka brokers.

Each fault is the sequence an operator, or bad luck, runs against a cluster under load:
a leader killed, the group coordinator's broker restarted, a rolling restart, the
controller quorum's leader killed, two brokers down at once. It takes a ``Target`` (the
cluster, the group under load and its topics, and two hooks of the harness: ``mark``
stamps a fault's moment for the served-again figures, ``spread(n)`` paces n steps over
the stream) and returns one line per step saying what it hurt. ``benchmarks.chaos``
runs the load and counts; these only hurt the cluster.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from benchmarks import netfaults
from streamfer_dev.kafka_cluster import REPLICAS, KafkaCluster
from worker.errors import StackError

__all__ = [
    "ClusterFault",
    "Target",
    "controller_leader_kill",
    "disk_full",
    "leader_kill_then_coordinator_restart",
    "rolling_restart",
    "share_leader_then_coordinator_kill",
    "stall_bound_s",
    "transaction_coordinator_kill",
    "two_brokers_down",
]

TAKEOVER_S = 6.0
"""How long a killed broker stays away before it starts again: the others lead and
coordinate meanwhile (the controller fences it after ``broker.session.timeout.ms``)."""

LEAD_S = 8.0
"""Load before the first fault of a sequence that does not spread its steps."""

OPEN_WAIT_S = 10.0
"""How long to look for an open transaction before a kill that needs one."""

BELOW_MIN_ISR_S = 20.0
"""How long two of three brokers stay down: below ``min.insync.replicas = 2`` the last
one accepts no write, so producers wait rather than fail."""


DISK_FULL_EXIT_S = 60.0
"""How long a broker whose only log directory is full may take to stop by itself (it
fails its next write, the controller's periodic one within a second): past that, it is
reported as still running and stopped."""


def stall_bound_s(*, exactly_once: bool, session_timeout_s: float) -> float:
    """How long a partition may sit still after a cluster fault before it is a stall.

    Every fault here takes a broker away, and with it, for some worker, the group's
    coordinator or a partition's leader. At least once: a session timeout and a settling
    time, as after a network fault (the harness keeps a longer floor of its own).
    Exactly-once: a worker's transactional call can then wedge in librdkafka as when Kafka
    is cut off (``send_offsets_to_transaction`` after the group coordinator moved, seen
    after a restart of its broker); the worker gives it up and starts again in place,
    which takes the bound of a cut (``netfaults.recovery_bound_s``)."""
    cut = netfaults.net_faults(session_timeout_s)["broker-down"]
    return netfaults.recovery_bound_s(
        cut, exactly_once=exactly_once, session_timeout_s=session_timeout_s
    )


@dataclass(frozen=True)
class Target:
    """The cluster under load and the harness's hooks; ``topics`` lists the requests
    topic first, the results topic second; ``transactional_ids``, the exactly-once
    workers' (none at least once)."""

    cluster: KafkaCluster
    group: str
    topics: tuple[str, ...]
    mark: Callable[[], None]
    spread: Callable[[int], Iterator[int]]
    transactional_ids: tuple[str, ...] = ()


ClusterFault = Callable[[Target], list[str]]


def leader_kill_then_coordinator_restart(
    target: Target,
    *,
    coordinator: bool = True,
    spare_coordinator: bool = False,
    kill_coordinator: bool = False,
) -> list[str]:
    """SIGKILL the broker leading most request partitions, start it again once the others
    took over, and (with ``coordinator``) when every replica is back in sync restart
    (SIGTERM) the broker coordinating the group. ``spare_coordinator``: the leader killed
    is one that does not coordinate the group; ``kill_coordinator``: the broker killed is
    the group's coordinator (a leader of request partitions too), so every member's
    session times out before the group moves."""
    cluster = target.cluster
    hurt: list[str] = []
    for n in target.spread(2 if coordinator else 1):
        target.mark()
        if n == 0:
            what = "leader"
            if kill_coordinator:
                node, what = cluster.coordinator_of(target.group), "coordinator"
            else:
                spared = frozenset(
                    {cluster.coordinator_of(target.group)} if spare_coordinator else ()
                )
                node = cluster.leader_of_most(target.topics[0], spared)
            cluster.kill_node(node)
            time.sleep(TAKEOVER_S)
            hurt.append(f"killed {what} {node}")
        else:
            node = cluster.coordinator_of(target.group)
            cluster.stop_node(node)
            hurt.append(f"restarted coordinator {node}")
        cluster.start_node(node)
        cluster.wait_in_sync(list(target.topics))
    return hurt


def rolling_restart(target: Target) -> list[str]:
    """SIGTERM each broker in turn and start it again, the next one only once every
    replica (the internal topics' too) is back in sync; the controller quorum's leader
    last, as an operator would, so the quorum elects once."""
    cluster = target.cluster
    time.sleep(LEAD_S)
    leader = cluster.quorum_leader()
    order = sorted(range(1, REPLICAS + 1), key=lambda node: node == leader)
    for node in order:
        target.mark()
        cluster.stop_node(node)
        cluster.start_node(node)
        cluster.wait_in_sync(None)
    return [f"restarted {node}" for node in order]


def controller_leader_kill(target: Target) -> list[str]:
    """SIGKILL the controller quorum's leader (every node is broker and controller too);
    start it again once the other two elected a leader."""
    cluster = target.cluster
    time.sleep(LEAD_S)
    target.mark()
    node = cluster.quorum_leader()
    cluster.kill_node(node)
    time.sleep(TAKEOVER_S)
    cluster.start_node(node)
    cluster.wait_in_sync(None)
    return [f"killed quorum leader {node}, then {cluster.quorum_leader()} led"]


def two_brokers_down(target: Target, down_s: float = BELOW_MIN_ISR_S) -> list[str]:
    """SIGKILL both brokers that do not lead most request partitions, for ``down_s``: the
    one left has no quorum and too few in-sync replicas to take a write, so every
    producer waits (nothing may fail into a dead letter); then start both again."""
    cluster = target.cluster
    time.sleep(LEAD_S)
    kept = cluster.leader_of_most(target.topics[0])
    down = [node for node in range(1, REPLICAS + 1) if node != kept]
    target.mark()
    for node in down:
        cluster.kill_node(node)
    time.sleep(down_s)
    for node in down:
        cluster.start_node(node)
    cluster.wait_in_sync(None)
    return [f"killed {down[0]} and {down[1]} for {down_s:.0f}s, {kept} left"]


def transaction_coordinator_kill(target: Target) -> list[str]:
    """SIGKILL the broker coordinating a worker's ``transactional.id`` (one that does not
    coordinate the group, where the ids allow) at a moment a transaction is open on the
    results topic, and start it again once the others took over: the worker's open
    transaction ends on the new coordinator, committed or aborted, never half."""
    cluster = target.cluster
    if not target.transactional_ids:
        raise StackError("killing a transaction coordinator needs exactly-once workers")
    time.sleep(LEAD_S)
    group_node = cluster.coordinator_of(target.group)
    nodes = {tid: cluster.transaction_coordinator_of(tid) for tid in target.transactional_ids}
    tid = next((t for t, n in nodes.items() if n != group_node), target.transactional_ids[0])
    deadline = time.monotonic() + OPEN_WAIT_S
    while not (open_now := cluster.open_transactions(target.topics[1])):
        if time.monotonic() > deadline:
            raise StackError(f"no transaction open on {target.topics[1]} in {OPEN_WAIT_S:.0f}s")
    target.mark()
    cluster.kill_node(nodes[tid])
    time.sleep(TAKEOVER_S)
    cluster.start_node(nodes[tid])
    cluster.wait_in_sync(None)
    return [
        f"killed {nodes[tid]}, transaction coordinator of {tid} (group coordinator "
        f"{group_node}) with a transaction open on results partitions {open_now}"
    ]


def share_leader_then_coordinator_kill(target: Target) -> list[str]:
    """For a share group: SIGKILL the broker leading most request partitions, start it
    again once the others took over and every replica is in sync, then SIGKILL the
    broker keeping the share state of most request partitions (the share coordinator)
    and start it again; each after ``LEAD_S`` of load, so that both fall inside a load
    that outlasts them. Records a worker held when its acknowledgement could not land
    are delivered again once their lock expires: at least once, none lost."""
    cluster = target.cluster
    requests = target.topics[0]
    hurt: list[str] = []
    for n in range(2):
        time.sleep(LEAD_S)
        if n == 0:
            node, what = cluster.leader_of_most(requests), "leader of most request partitions"
        else:
            keepers = Counter(
                cluster.share_coordinator_of(target.group, requests, p)
                for p in cluster.partitions_of(requests)
            )
            node = keepers.most_common(1)[0][0]
            group_node = cluster.group_coordinator_of(target.group)
            what = (
                f"share coordinator of {keepers[node]} partitions (group coordinator {group_node})"
            )
        target.mark()
        cluster.kill_node(node)
        time.sleep(TAKEOVER_S)
        cluster.start_node(node)
        cluster.wait_in_sync(None)
        hurt.append(f"killed {node}, {what}")
    return hurt


def disk_full(target: Target) -> list[str]:
    """Fill the log directory (a tmpfs of its own) of the broker leading most request
    partitions: its next write fails, it takes the directory offline and, with no other
    one, stops by itself. Then, as an operator would, free the space and start it again."""
    cluster = target.cluster
    time.sleep(LEAD_S)
    node = cluster.leader_of_most(target.topics[0])
    target.mark()
    try:
        taken = cluster.fill_disk(node)
        stopped_s = cluster.wait_exit(node, DISK_FULL_EXIT_S)
    finally:
        cluster.free_disk(node)
    if stopped_s is None:
        cluster.stop_node(node)
        what = f"still running {DISK_FULL_EXIT_S:.0f}s later, stopped"
    else:
        what = f"it stopped by itself {stopped_s:.1f}s later"
        time.sleep(max(0.0, TAKEOVER_S - stopped_s))
    cluster.start_node(node)
    cluster.wait_in_sync(None)
    return [f"filled {node}'s log directory (its last {taken >> 20} MiB), {what}; freed, started"]
