"""A highly available Redis as Sentinel runs it: a primary, one replica and three
Sentinels on 127.0.0.1, each a ``redis-server`` process (``--sentinel`` is built into the
server binary) stopped by its PID.

The Sentinels agree that a primary is down after ``DOWN_AFTER_MS`` and promote the
replica; ``kill_primary`` is the fault a failover test injects.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from streamfer_dev.stack import Service, start_owned, start_redis
from worker.errors import StackError

__all__ = ["DOWN_AFTER_MS", "SERVICE_NAME", "RedisSentinel", "start_redis_sentinel"]

SERVICE_NAME = "streamfer"
DOWN_AFTER_MS = 1000
"""How long the Sentinels wait before they call a silent primary down (Redis' default
of 30 s is tuned for networks where a second's silence is common)."""


@dataclass
class RedisSentinel:
    """The nodes and Sentinels; ``nodes[0]`` started as the primary."""

    nodes: list[Service]
    sentinels: list[Service]

    @property
    def addresses(self) -> list[str]:
        """The Sentinels' ``host:port``, what ``[redis] sentinels`` lists."""
        return [s.address for s in self.sentinels]

    def primary(self) -> Service:
        """The node the first Sentinel that answers names as the primary now."""
        for sentinel in self.sentinels:
            named = _named(sentinel)
            for node in self.nodes:
                if node.address == named:
                    return node
        raise StackError(f"no Sentinel names a primary of {SERVICE_NAME!r}")

    def kill_primary(self) -> Service:
        """SIGKILL the current primary; returns it (stopped)."""
        node = self.primary()
        node.kill()
        return node

    def wait_for_new_primary(self, old: Service, timeout: float = 30.0) -> Service:
        """Until every live Sentinel names a primary other than ``old``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            named = {_named(s) for s in self.sentinels if s.process.poll() is None}
            if len(named) == 1 and None not in named and old.address not in named:
                return self.primary()
            time.sleep(0.2)
        raise StackError(f"the Sentinels promoted no replica in {timeout:.0f}s")

    def stop(self) -> None:
        for svc in [*self.sentinels, *self.nodes]:
            svc.stop()


def _url(port: int) -> str:
    return f"redis://127.0.0.1:{port}/0"


def _ask(sentinel: Service) -> redis.Redis:
    host, port = sentinel.address.rsplit(":", 1)
    return redis.Redis(host, int(port), socket_timeout=2, decode_responses=True)


def _named(sentinel: Service) -> str | None:
    """The URL of the node ``sentinel`` names as the primary; None when it is down or
    names none yet."""
    try:
        answer: Any = _ask(sentinel).sentinel_get_master_addr_by_name(SERVICE_NAME)
        return _url(int(answer[1]))
    except (redis.RedisError, TypeError):
        return None


def _sentinel(binary: str, primary_port: int, timeout: float) -> Service:
    def argv(port: int, work: Path) -> list[str]:
        conf = work / "sentinel.conf"  # a Sentinel rewrites its config: one each
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {work}\n"
            f"sentinel monitor {SERVICE_NAME} 127.0.0.1 {primary_port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE_NAME} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SERVICE_NAME} 10000\n"
        )
        return [binary, str(conf), "--sentinel"]

    return start_owned("sentinel", argv, lambda p: f"127.0.0.1:{p}", None, timeout)


def start_redis_sentinel(*, timeout: float = 60.0) -> RedisSentinel:
    """A primary, a replica following it and three Sentinels watching it (quorum 2);
    returns once the replica is in sync and every Sentinel knows the replica and the
    other two Sentinels, so that a failover can be agreed on at once."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise StackError("redis-server not found; install it (Debian package redis-server)")
    started = RedisSentinel([], [])
    try:
        started.nodes.append(start_redis(timeout=timeout))
        primary_port = int(started.nodes[0].address.rsplit(":", 1)[1].split("/")[0])
        following = ("--replicaof", "127.0.0.1", str(primary_port))
        started.nodes.append(start_redis(timeout=timeout, args=following))
        for _ in range(3):
            started.sentinels.append(_sentinel(binary, primary_port, timeout))
        _wait_until_watched(started, timeout)
        return started
    except BaseException:
        started.stop()
        raise


def _wait_until_watched(group: RedisSentinel, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    why = "not asked yet"
    while time.monotonic() < deadline:
        why = _unready(group)
        if not why:
            return
        time.sleep(0.2)
    raise StackError(f"Redis Sentinel group not ready in {timeout:.0f}s: {why}")


def _unready(group: RedisSentinel) -> str:
    replica = redis.Redis.from_url(group.nodes[1].address, socket_timeout=2)
    try:
        link = replica.info("replication").get("master_link_status")
    except redis.RedisError as exc:
        return f"replica: {exc}"
    finally:
        replica.close()
    if link != "up":
        return f"replica link {link}"
    for sentinel in group.sentinels:
        try:
            state: Any = _ask(sentinel).sentinel_master(SERVICE_NAME)
        except redis.RedisError as exc:
            return f"sentinel {sentinel.address}: {exc}"
        if int(state["num-slaves"]) < 1 or int(state["num-other-sentinels"]) < 2:
            return (
                f"sentinel {sentinel.address} sees {state['num-slaves']} replicas and "
                f"{state['num-other-sentinels']} other sentinels"
            )
    return ""
