"""Apache Kafka as production runs it: three KRaft nodes on 127.0.0.1, each a combined
broker and controller, the three forming the controller quorum. Topics get three
replicas and ``min.insync.replicas = 2`` (the internal ones too), share groups are on,
and each node is a JVM of its own, stopped by its PID.

A test or the fault harness can stop (SIGTERM), kill (SIGKILL) and start any node again
on its logs and ports, and ask which node leads a partition or coordinates a group, to
hurt the one that matters. With ``disk_mb`` each node's log directory is a ``tmpfs`` of
its own (``streamfer_dev.small_disk``), which ``fill_disk`` fills. The heaps are small
(384 MB each, C1 only, as ``start_kafka``): three nodes and the workers share two cores
here.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import IsolationLevel, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec  # not re-exported by name

from streamfer_dev import small_disk
from streamfer_dev.stack import (
    Service,
    _spawn,
    _wait_for_port,
    format_kafka_storage,
    free_port,
    kafka_argv,
    kraft_node_props,
    new_cluster_id,
)
from worker.errors import StackError

__all__ = ["REPLICAS", "KafkaCluster", "java_string_hash", "start_kafka_cluster"]

REPLICAS = 3


@dataclass
class KafkaCluster:
    """The nodes, by node id (1, 2, 3); ``address`` is every node's listener, what a
    client's ``bootstrap.servers`` names."""

    work: Path
    nodes: dict[int, Service]
    heap_mb: int
    owned: bool = True
    ports: dict[int, int] = field(default_factory=dict)
    disks: dict[int, Path] = field(default_factory=dict)
    """Each node's log directory where it is a tmpfs of its own (``disk_mb``)."""

    @property
    def address(self) -> str:
        return ",".join(f"127.0.0.1:{self.ports[i]}" for i in sorted(self.ports))

    def stop_node(self, node_id: int) -> None:
        """SIGTERM: the node hands its leaderships over and leaves cleanly."""
        self.nodes[node_id].stop(timeout=60)

    def kill_node(self, node_id: int) -> None:
        """SIGKILL: the node vanishes mid-request, as a crashed machine would."""
        self.nodes[node_id].kill()

    def start_node(self, node_id: int, timeout: float = 120.0) -> None:
        """Start a stopped node again on its logs and ports; returns once it listens."""
        if self.nodes[node_id].process.poll() is None:
            raise StackError(f"Kafka node {node_id} is running")
        self.nodes[node_id] = _start_node(self.work / f"node-{node_id}", node_id, self.heap_mb)
        _wait_for_port(self.nodes[node_id], self.ports[node_id], timeout)

    def fill_disk(self, node_id: int) -> int:
        """Take every byte left on the node's log directory; returns how many."""
        if node_id not in self.disks:
            raise StackError("filling a disk needs the cluster started with disk_mb")
        return small_disk.fill(self.disks[node_id])

    def free_disk(self, node_id: int) -> None:
        small_disk.free(self.disks[node_id])

    def wait_exit(self, node_id: int, timeout: float) -> float | None:
        """Seconds until the node's process ended by itself, None if not in ``timeout``."""
        began = time.monotonic()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.nodes[node_id].process.wait(timeout)
            return time.monotonic() - began
        return None

    def partitions_of(self, topic: str) -> list[int]:
        return sorted(self._admin().list_topics(topic, timeout=10).topics[topic].partitions)

    def leader_of_most(self, topic: str, sparing: frozenset[int] = frozenset()) -> int:
        """The node leading the most partitions of ``topic``, among those not ``sparing``."""
        meta = self._admin().list_topics(topic, timeout=10).topics[topic]
        leaders = Counter(
            p.leader for p in meta.partitions.values() if p.leader >= 0 and p.leader not in sparing
        )
        if not leaders:
            raise StackError(f"no partition of {topic} has a leader")
        return leaders.most_common(1)[0][0]

    def coordinator_of(self, group: str) -> int:
        """The node that coordinates consumer group ``group``."""
        admin = self._admin()  # alive until the answer is in
        future = admin.describe_consumer_groups([group], request_timeout=10)[group]
        return int(future.result().coordinator.id)

    def transaction_coordinator_of(self, transactional_id: str) -> int:
        """The node coordinating ``transactional_id``: the leader of its partition of
        ``__transaction_state``, ``abs(hashCode) % partitions`` as the broker places it."""
        return self._internal_leader("__transaction_state", transactional_id)

    def group_coordinator_of(self, group: str) -> int:
        """The node coordinating ``group`` found by placement, not by asking the group
        (which a share group's client may not answer): its ``__consumer_offsets`` leader."""
        return self._internal_leader("__consumer_offsets", group)

    def share_coordinator_of(self, group: str, topic: str, partition: int) -> int:
        """The node keeping share group ``group``'s state of ``topic[partition]`` (what
        is acknowledged, what is locked): the leader of ``__share_group_state`` for the
        key ``group:topicId:partition``."""
        admin = self._admin()
        described = admin.describe_topics(TopicCollection([topic]), request_timeout=10)
        topic_id = described[topic].result().topic_id
        return self._internal_leader("__share_group_state", f"{group}:{topic_id}:{partition}")

    def open_transactions(self, topic: str) -> list[int]:
        """The partitions of ``topic`` where a transaction is open: their last stable
        offset (what read_committed may read) is short of their high watermark."""
        admin = self._admin()
        parts = admin.list_topics(topic, timeout=10).topics[topic].partitions
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        ends: dict[IsolationLevel, dict[int, int]] = {}
        for level in IsolationLevel:
            asked = {TopicPartition(topic, p): latest for p in parts}
            answers = admin.list_offsets(asked, isolation_level=level, request_timeout=10)
            ends[level] = {tp.partition: f.result().offset for tp, f in answers.items()}
        stable, high = ends[IsolationLevel.READ_COMMITTED], ends[IsolationLevel.READ_UNCOMMITTED]
        return sorted(p for p in parts if stable[p] < high[p])

    def _internal_leader(self, topic: str, key: str) -> int:
        """The leader of ``key``'s partition of an internal topic (a coordinator)."""
        meta = self._admin().list_topics(topic, timeout=10).topics[topic]
        if not meta.partitions:
            raise StackError(f"{topic} does not exist yet")
        leader = meta.partitions[_java_abs(java_string_hash(key)) % len(meta.partitions)].leader
        if leader < 0:
            raise StackError(f"{topic}'s partition for {key!r} has no leader")
        return int(leader)

    def quorum_leader(self) -> int:
        """The node leading the controller quorum, as the nodes last recorded it (each
        writes the leader it knows to its ``quorum-state`` file; the newest epoch wins)."""
        best = (-1, -1)
        for node_id in self.nodes:
            path = self.work / f"node-{node_id}" / "data" / "__cluster_metadata-0" / "quorum-state"
            with contextlib.suppress(OSError, ValueError):
                state = json.loads(path.read_text())
                if int(state["leaderId"]) >= 0:  # -1: an election under way
                    best = max(best, (int(state["leaderEpoch"]), int(state["leaderId"])))
        if best[1] < 0:
            raise StackError("no node has recorded a controller quorum leader")
        return best[1]

    def wait_in_sync(self, topics: list[str] | None, timeout: float = 120.0) -> None:
        """Until every partition of ``topics`` (None: of every topic, the internal ones
        too) has all its replicas in sync (a restarted node has caught up), so that the
        next fault starts from a whole cluster."""
        admin = self._admin()
        deadline = time.monotonic() + timeout
        short: list[str] = []
        while time.monotonic() < deadline:
            short = []
            with contextlib.suppress(Exception):
                meta = admin.list_topics(timeout=5)
                for topic in meta.topics if topics is None else topics:
                    for p in meta.topics[topic].partitions.values():
                        if len(p.isrs) < len(p.replicas):
                            short.append(f"{topic}[{p.id}] isr {p.isrs}")
                if not short:
                    return
            time.sleep(0.5)
        raise StackError(f"replicas not back in sync in {timeout:.0f}s: {short[:5]}")

    def stop(self) -> None:
        try:
            for node in self.nodes.values():
                node.stop(timeout=30)
        finally:
            for disk in self.disks.values():
                small_disk.unmount(disk)
        if self.owned:
            shutil.rmtree(self.work, ignore_errors=True)

    def _admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.address})


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (a 32-bit signed sum over UTF-16 code units), by which
    Kafka places a group or transactional id on a partition of its internal topics."""
    units = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def _java_abs(n: int) -> int:
    """Kafka's ``Utils.abs``: the minimum integer maps to 0, not to itself."""
    return 0 if n == -(1 << 31) else abs(n)


def _start_node(work: Path, node_id: int, heap_mb: int) -> Service:
    process = _spawn("kafka", kafka_argv(work, heap_mb), work)
    return Service(f"kafka-{node_id}", "", process, work, work / "kafka.log")


def start_kafka_cluster(
    workdir: Path | None = None,
    *,
    heap_mb: int = 384,
    timeout: float = 180.0,
    consumer_session_timeout_ms: int = 10_000,
    disk_mb: int | None = None,
) -> KafkaCluster:
    """Three nodes, formatted as one cluster, started together (a quorum needs two of
    them to elect its leader); returns once every node lists all three brokers.
    ``disk_mb``: each node's log directory is a tmpfs of that size (root only)."""
    owned = workdir is None
    work = Path(tempfile.mkdtemp(prefix="streamfer-kcluster-")) if workdir is None else workdir
    ids = range(1, REPLICAS + 1)
    picked: list[int] = []
    while len(picked) < 2 * REPLICAS:  # the kernel may hand out a port just released again
        port = free_port()
        if port not in picked:
            picked.append(port)
    ports = dict(zip(ids, picked[:REPLICAS], strict=True))
    controllers = dict(zip(ids, picked[REPLICAS:], strict=True))
    voters = ",".join(f"{i}@127.0.0.1:{controllers[i]}" for i in ids)
    cluster_id = new_cluster_id()
    cluster = KafkaCluster(work, {}, heap_mb, owned, ports)
    try:
        for i in ids:
            node_dir = work / f"node-{i}"
            node_dir.mkdir(parents=True, exist_ok=True)
            if disk_mb is not None:
                small_disk.mount(node_dir / "data", disk_mb)
                cluster.disks[i] = node_dir / "data"
            props = kraft_node_props(
                node_id=i,
                port=ports[i],
                controller_port=controllers[i],
                voters=voters,
                data=node_dir / "data",
                replicas=REPLICAS,
                consumer_session_timeout_ms=consumer_session_timeout_ms,
            )
            format_kafka_storage(node_dir, props, cluster_id, ("share.version=1",))
        for i in ids:
            cluster.nodes[i] = _start_node(work / f"node-{i}", i, heap_mb)
        for i in ids:
            _wait_for_port(cluster.nodes[i], ports[i], timeout)
        _wait_for_brokers(cluster, timeout)
        return cluster
    except BaseException:
        cluster.stop()
        raise


def _wait_for_brokers(cluster: KafkaCluster, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    seen = 0
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            seen = len(cluster._admin().list_topics(timeout=2).brokers)
            if seen == REPLICAS:
                return
        time.sleep(0.3)
    tails = "\n".join(n.log_tail(10) for n in cluster.nodes.values())
    raise StackError(f"the cluster listed {seen} of {REPLICAS} brokers in {timeout:.0f}s:\n{tails}")
