"""Highly available Redis set-ups whose primary the fault harness and the soak kill.

Each starts its Redis processes, seeds the demo model's entities (``c0``, ``c1`` ...,
the ids ``benchmarks.chaos.Env`` holds) on the primaries and waits until the replicas
have them, and yields a ``Failover``: the ``[redis]`` table a worker's config needs, and
``fail``, which SIGKILLs a primary and returns once its replica serves in its place.

- ``sentinel``: a primary, a replica, three Sentinels (``streamfer_dev.redis_sentinel``).
- ``cluster``: three primaries, each with a replica; the primary killed is the one whose
  slots hold most feature keys (``streamfer_dev.redis_cluster_failover``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import orjson
import redis

from streamfer_dev import redis_cluster_failover as cluster_failover
from streamfer_dev.modelgen import DemoModel, seed_entities
from streamfer_dev.redis_sentinel import SERVICE_NAME, start_redis_sentinel
from streamfer_dev.stack import start_redis_cluster

__all__ = ["CLUSTER_NODE_TIMEOUT_MS", "Failover", "cluster", "sentinel"]

CLUSTER_NODE_TIMEOUT_MS = 1000
"""How long Redis Cluster nodes wait before they call a silent primary failing, as the
Sentinels' ``DOWN_AFTER_MS``: the replica is promoted a second or two after the kill."""

SOCKET_TIMEOUT = "socket_timeout_s = 2.0"
"""The workers' Redis timeout: a command to the dead primary fails in 2 s, not 5."""


@dataclass
class Failover:
    """A Redis set-up ready for load: the workers' ``[redis]`` table, and the fault."""

    redis_table: str
    fail: Callable[[], str]
    """SIGKILL a primary, wait until a replica serves its keys; says what happened."""


@contextlib.contextmanager
def sentinel(model: DemoModel) -> Iterator[Failover]:
    group = start_redis_sentinel()
    try:
        client = redis.Redis.from_url(group.primary().address)
        seed_entities(client, model, prefix="c")
        client.wait(1, 5000)  # on the replica too, before the primary can die
        client.close()

        def fail() -> str:
            killed_at = time.monotonic()
            old = group.kill_primary()
            new = group.wait_for_new_primary(old)
            return f"{new.address} promoted {time.monotonic() - killed_at:.1f}s after the kill"

        sentinels = orjson.dumps(group.addresses).decode()
        yield Failover(
            f'sentinels = {sentinels}\nservice_name = "{SERVICE_NAME}"\n{SOCKET_TIMEOUT}', fail
        )
    finally:
        group.stop()


@contextlib.contextmanager
def cluster(model: DemoModel) -> Iterator[Failover]:
    nodes = start_redis_cluster(nodes=6, replicas=1, node_timeout_ms=CLUSTER_NODE_TIMEOUT_MS)
    try:
        client = redis.RedisCluster.from_url(nodes.address)
        entities = seed_entities(client, model, prefix="c")  # type: ignore[arg-type]
        client.close()
        cluster_failover.wait_replicated(nodes)
        keys = [f"features:{entity}" for entity in entities]

        def fail() -> str:
            killed_at = time.monotonic()
            old = cluster_failover.primary_of_most(nodes, keys)
            old.kill()
            primaries = cluster_failover.wait_for_promotion(nodes, old)
            took = time.monotonic() - killed_at
            return (
                f"killed {cluster_failover.host_of(old)}; primaries {primaries} after {took:.1f}s"
            )

        yield Failover(f'url = "{nodes.address}"\ncluster = true\n{SOCKET_TIMEOUT}', fail)
    finally:
        nodes.stop()
