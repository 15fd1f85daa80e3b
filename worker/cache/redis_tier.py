"""The output cache's shared tier: encoded outputs in Redis, with a TTL.

Per batch it costs one round trip to read (one MGET; against a Redis Cluster, which
refuses MGET across slots, one GET per key, each node's share in one write, as
``worker.features.stores.exchange`` sends the feature lookups) and one to write what the model
computed (``SET key value EX ttl`` per row, pipelined the same way). A value is
``VALUE_FORMAT`` followed by the row's outputs as the result publishes them (an orjson
object of the result fields); anything else found under a key (another format, garbage,
a value of another Redis type) is a miss, counted as ``corrupt``, and is overwritten
once the row is computed.

The tier is an optimisation, so it never stops a batch: a round trip that fails (Redis
down, a timeout, an ACL refusal) counts an error, reads as all misses, and rests the tier
for a second, doubling to 30 s while it keeps failing; the feature store keeps its own
retry rules. Errors are logged when the tier starts failing or its reason changes, and
once it works again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis

from worker.core import Clock, monotonic_clock
from worker.errors import StreamferError
from worker.features import Command, RedisClient, exchange

__all__ = ["VALUE_FORMAT", "CacheFetch", "RedisCacheTier", "decoded_value"]

log = logging.getLogger(__name__)

VALUE_FORMAT = b"sfc1:"
"""Leads every value the tier writes; a value without it is not read."""

_REST_S = (1.0, 30.0)
"""First and longest rest after a failed round trip."""


def decoded_value(blob: object, fields: Sequence[str] | None) -> bytes | None:
    """The encoded outputs a stored value holds, or None when it is not one this tier
    wrote: no ``VALUE_FORMAT``, not a JSON object (of ``fields``, in order, when
    given), or not in orjson's own encoding (the result embeds the bytes verbatim)."""
    if not isinstance(blob, bytes) or not blob.startswith(VALUE_FORMAT):
        return None
    body = blob[len(VALUE_FORMAT) :]
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if type(parsed) is not dict or not parsed:
        return None
    if fields is not None and list(parsed) != list(fields):
        return None
    return body if orjson.dumps(parsed) == body else None


@dataclass(slots=True)
class CacheFetch:
    """What one read found: values by row, and how many stored values were unreadable."""

    found: dict[int, bytes] = field(default_factory=dict)
    corrupt: int = 0
    failed: bool = False


class RedisCacheTier:
    """Encoded outputs under ``prefix`` + hex key in the Redis ``connect`` returns.

    ``connect`` is called on first use and again after a failure, so a Redis that is down
    at start-up (or a cluster whose slot map cannot be read) only delays the tier.
    ``fields``, when known, are the result fields a value must hold, in order.
    ``on_error(kind)`` hears each failed round trip (``redis``) and each unreadable value
    (``corrupt``). Reads come from the enrich stage, writes from the publish stage.
    """

    def __init__(
        self,
        connect: Callable[[], RedisClient],
        *,
        ttl_s: int,
        prefix: str,
        fields: Sequence[str] | None,
        on_error: Callable[[str, int], None],
        where: str = "output cache",
        clock: Clock = monotonic_clock,
    ) -> None:
        self._connect = connect
        self._ttl = str(ttl_s).encode()
        self._prefix = prefix.encode()
        self._fields = list(fields) if fields is not None else None
        self._on_error = on_error
        self._where = where
        self._clock = clock
        self._lock = threading.Lock()
        self._client: RedisClient | None = None
        self._rest = 0.0
        self._resting_until = 0.0
        self._problem: str | None = None

    def redis_key(self, key: bytes) -> bytes:
        return self._prefix + key.hex().encode()

    def get_many(self, keys: Sequence[bytes], rows: Sequence[int]) -> CacheFetch:
        """Values for ``keys[r]`` of each of ``rows`` (distinct keys asked once)."""
        fetch = CacheFetch()
        if not rows:
            return fetch
        client = self._usable()
        if client is None:
            fetch.failed = True
            return fetch
        distinct = list(dict.fromkeys(keys[r] for r in rows))
        names = [self.redis_key(k) for k in distinct]
        cluster = isinstance(client, redis.RedisCluster)
        if cluster:
            commands = [b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(k), k) for k in names]
            routes = names
        else:
            commands = [b"*%d\r\n$4\r\nMGET\r\n" % (len(names) + 1)]
            commands += [b"$%d\r\n%s\r\n" % (len(k), k) for k in names]
            commands, routes = [b"".join(commands)], []
        command = self._command(client, "GET" if cluster else "MGET")
        try:
            answers, errors = exchange(client, commands, routes, command)
        except (StreamferError, redis.RedisError) as exc:
            self._failed(str(exc))
            fetch.failed = True
            return fetch
        if cluster:
            blobs: list[Any] = answers
            # a refusal of one key (WRONGTYPE) is its value's problem; others the tier's
            whole = [e for e in errors.values() if not str(e).startswith("WRONGTYPE")]
            if whole:
                self._failed(f"Redis refused GET: {whole[0]}")
                fetch.failed = True
                return fetch
            fetch.corrupt += len(errors)
        else:
            if errors:
                self._failed(f"Redis refused MGET: {errors[0]}")
                fetch.failed = True
                return fetch
            blobs = answers[0]
            if not isinstance(blobs, list) or len(blobs) != len(names):
                self._failed(f"MGET of {len(names)} keys answered {type(blobs).__name__}")
                fetch.failed = True
                return fetch
        self._worked()
        value_of: dict[bytes, bytes] = {}
        for key, blob in zip(distinct, blobs, strict=True):
            if blob is None:
                continue
            value = decoded_value(blob, self._fields)
            if value is None:
                fetch.corrupt += 1
            else:
                value_of[key] = value
        if fetch.corrupt:
            self._on_error("corrupt", fetch.corrupt)
        if value_of:
            fetch.found = {r: value_of[keys[r]] for r in rows if keys[r] in value_of}
        return fetch

    def put_many(self, items: Sequence[tuple[bytes, bytes]]) -> bool:
        """``SET key value EX ttl`` for each (key, encoded outputs); False when the round
        trip failed (counted and logged)."""
        if not items:
            return True
        client = self._usable()
        if client is None:
            return False
        ttl = b"$%d\r\n%s\r\n" % (len(self._ttl), self._ttl)
        commands: list[bytes] = []
        routes: list[bytes] = []
        for key, value in items:
            name, stored = self.redis_key(key), VALUE_FORMAT + value
            commands.append(
                b"*5\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$2\r\nEX\r\n%s"
                % (len(name), name, len(stored), stored, ttl)
            )
            routes.append(name)
        try:
            _, errors = exchange(client, commands, routes, self._command(client, "SET"))
        except (StreamferError, redis.RedisError) as exc:
            self._failed(str(exc))
            return False
        if errors:
            self._failed(f"Redis refused SET: {next(iter(errors.values()))}")
            return False
        self._worked()
        return True

    def _usable(self) -> RedisClient | None:
        """The client, unless the tier rests after a failure; connects when needed."""
        with self._lock:
            if self._rest and self._clock() < self._resting_until:
                return None
            client = self._client
        if client is not None:
            return client
        try:
            client = self._connect()
        except (StreamferError, redis.RedisError) as exc:
            self._failed(f"cannot connect: {exc}")
            return None
        with self._lock:
            self._client = client
        return client

    def _command(self, client: RedisClient, name: str) -> Command:
        if isinstance(client, redis.RedisCluster):
            kwargs = client.get_connection_kwargs()  # type: ignore[no-untyped-call]
        else:
            kwargs = client.connection_pool.connection_kwargs
        user = str(kwargs.get("username") or "default")
        return Command(name, self._prefix.decode() + "*", user)

    def _failed(self, why: str) -> None:
        self._on_error("redis", 1)
        with self._lock:
            first, longest = _REST_S
            self._rest = min(self._rest * 2, longest) if self._rest else first
            self._resting_until = self._clock() + self._rest
            rest, changed = self._rest, why != self._problem
            self._problem = why
        if changed:
            log.warning(
                "%s: Redis tier failed (%s); its rows count as misses, next try in %.0f s",
                self._where,
                why,
                rest,
            )

    def _worked(self) -> None:
        if not self._rest:
            return
        with self._lock:
            was, self._rest, self._problem = self._problem, 0.0, None
        if was is not None:
            log.info("%s: Redis tier answers again", self._where)
