"""A Redis Cluster primary failing over to its replica, as a fault test injects it.

``primary_of_most`` names the primary whose slots hold most of a set of keys (the one
whose loss hurts most); ``kill`` SIGKILLs it; ``wait_for_promotion`` returns once its
replica took its slots over and every live node agrees on one slot map that covers all
of them (``redis_cluster_ready``), which is when a client sees the cluster whole again.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable

import redis
from redis.crc import key_slot

from streamfer_dev.redis_cluster_ready import slot_map, unready_reason
from streamfer_dev.stack import RedisCluster, Service
from worker.errors import StackError

__all__ = ["host_of", "primary_of_most", "wait_for_promotion", "wait_replicated"]


def host_of(node: Service) -> str:
    """``host:port`` of a node, as ``CLUSTER SLOTS`` names it."""
    return node.address.removeprefix("redis://").removesuffix("/0")


def _client(node: Service) -> redis.Redis:
    host, port = host_of(node).rsplit(":", 1)
    return redis.Redis(host, int(port), socket_timeout=2.0)


def primary_of_most(cluster: RedisCluster, keys: Iterable[str]) -> Service:
    """The primary serving the slots of most of ``keys``."""
    client = _client(cluster.nodes[0])
    try:
        rows = slot_map(client.cluster("SLOTS"))
    finally:
        client.close()
    holders: Counter[str] = Counter()
    for key in keys:
        slot = key_slot(key.encode())
        holders.update(host for first, last, host in rows if first <= slot <= last)
    if not holders:
        raise StackError("no primary serves any of the keys")
    busiest = holders.most_common(1)[0][0]
    return next(node for node in cluster.nodes if host_of(node) == busiest)


def wait_replicated(cluster: RedisCluster, timeout: float = 30.0) -> None:
    """Until every replica's link is up and it has applied all its primary wrote, so a
    primary killed next loses no key."""
    deadline = time.monotonic() + timeout
    behind = ["not asked yet"]
    while time.monotonic() < deadline:
        infos = {}
        for node in cluster.nodes:
            client = _client(node)
            try:
                infos[host_of(node)] = client.info("replication")
            finally:
                client.close()
        behind = [
            host
            for host, info in infos.items()
            if info["role"] == "slave"
            and (
                info.get("master_link_status") != "up"
                or info["slave_repl_offset"]
                < infos[f"{info['master_host']}:{info['master_port']}"]["master_repl_offset"]
            )
        ]
        if not behind:
            return
        time.sleep(0.2)
    raise StackError(f"Redis Cluster replicas {behind} not in sync after {timeout:.0f}s")


def wait_for_promotion(cluster: RedisCluster, old: Service, timeout: float = 30.0) -> str:
    """Until every live node says the cluster is ok and maps every slot, none to ``old``;
    returns the primaries then (``host:port``, comma-separated)."""
    gone = host_of(old)
    live = [n for n in cluster.nodes if n is not old and n.process.poll() is None]
    deadline = time.monotonic() + timeout
    why = "not asked yet"
    while time.monotonic() < deadline:
        try:
            states, maps = {}, {}
            for node in live:
                client = _client(node)
                try:
                    info = client.cluster("INFO")
                    states[host_of(node)] = str(info.get("cluster_state", "unknown"))
                    maps[host_of(node)] = slot_map(client.cluster("SLOTS"))
                finally:
                    client.close()
            found = unready_reason(states, maps)
            rows = next(iter(maps.values()))
            if found is None and all(host != gone for _, _, host in rows):
                return ",".join(sorted({host for _, _, host in rows}))
            why = found or f"{gone} still serves slots"
        except redis.RedisError as exc:
            why = f"a node did not answer: {exc}"
        time.sleep(0.2)
    raise StackError(f"no replica took over from {gone} in {timeout:.0f}s: {why}")
