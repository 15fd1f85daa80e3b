"""When a fresh Redis Cluster can take writes on every node.

``redis-cli --cluster create`` returns once the slots are assigned, but the nodes learn
of each other over the cluster bus afterwards: one node can say ``cluster_state:ok``
while another still says ``fail``, or maps a slot to no one, and a client that lands
there gets ``ClusterDownError``. Ready means every node says ok and all of them agree on
one slot map that covers every slot.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import redis

from worker.errors import StackError

__all__ = ["SLOTS", "slot_map", "unready_reason", "wait_until_ready"]

SLOTS = 16384

SlotMap = frozenset[tuple[int, int, str]]


def slot_map(reply: Sequence[Sequence[object]]) -> SlotMap:
    """``CLUSTER SLOTS`` as (first slot, last slot, primary host:port) rows."""
    rows = set()
    for first, last, primary, *_ in reply:
        if not isinstance(primary, Sequence) or len(primary) < 2:
            raise StackError(f"CLUSTER SLOTS gave a row without a primary: {primary!r}")
        host = primary[0].decode() if isinstance(primary[0], bytes) else str(primary[0])
        rows.add((int(str(first)), int(str(last)), f"{host}:{primary[1]}"))
    return frozenset(rows)


def _covers_every_slot(slots: SlotMap) -> bool:
    covered = 0
    next_slot = 0
    for first, last, _ in sorted(slots):
        if first != next_slot:
            return False
        covered += last - first + 1
        next_slot = last + 1
    return covered == SLOTS


def unready_reason(states: dict[str, str], maps: dict[str, SlotMap]) -> str | None:
    """Why the cluster is not ready yet, from each node's state and slot map; None once
    it is."""
    not_ok = sorted(node for node, state in states.items() if state != "ok")
    if not_ok:
        return f"cluster_state is not ok on {', '.join(not_ok)}"
    if len(set(maps.values())) != 1:
        return "the nodes disagree on the slot map"
    (only,) = set(maps.values())
    if not _covers_every_slot(only):
        return f"the slot map does not cover all {SLOTS} slots"
    return None


def _state(client: redis.Redis) -> str:
    info = client.cluster("INFO")  # redis-py parses it into a dict
    return str(info.get("cluster_state", "unknown")) if isinstance(info, dict) else "unknown"


def wait_until_ready(hosts: Sequence[str], timeout: float) -> None:
    """Block until every node in ``hosts`` (host:port) is ready; ``StackError`` naming
    what was still wrong after ``timeout`` seconds."""
    clients = {
        host: redis.Redis(
            host=host.rsplit(":", 1)[0],
            port=int(host.rsplit(":", 1)[1]),
            socket_timeout=2.0,
        )
        for host in hosts
    }
    deadline = time.monotonic() + timeout
    reason = "not asked yet"
    try:
        while True:
            try:
                states = {host: _state(c) for host, c in clients.items()}
                maps = {host: slot_map(c.cluster("SLOTS")) for host, c in clients.items()}
                found = unready_reason(states, maps)
            except redis.RedisError as err:
                found = f"a node did not answer: {err}"
            if found is None:
                return
            reason = found
            if time.monotonic() > deadline:
                raise StackError(f"the Redis cluster was not ready after {timeout:.0f} s: {reason}")
            time.sleep(0.2)
    finally:
        for client in clients.values():
            client.close()
