"""Talking to Redis: the client, one round trip of pre-encoded commands, and what an
error reply means.

A batch's lookups are encoded as RESP by the stores (``worker.features.stores``) and written in
one go; ``round_trip`` reads the answers, keeping an error reply in its place so the
caller can judge it (``classify_redis_error``, ``settle``). Against a Redis Cluster
(``redis.cluster = true``) ``cluster_round_trip`` groups the commands by the node that
owns each key's slot and writes every node's share before reading any, so a batch still
costs about one round trip; a reply that says a slot moved refreshes the slot map and
the batch is asked once more.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from worker.config import FeatureSpec, RedisSettings
from worker.errors import FeatureStoreConfigError, FeatureStoreError
from worker.features.sentinel import sentinel_client

__all__ = [
    "REDIS_ERROR_KINDS",
    "Command",
    "RedisClient",
    "RedisTrouble",
    "classify_redis_error",
    "cluster_round_trip",
    "ping",
    "redis_client",
    "reply_text",
    "round_trip",
    "settle",
]

RedisClient = redis.Redis | RedisCluster

RedisTrouble = Literal["record", "outage", "config"]
"""What a Redis error means for a batch: ``record``, the requests of that one entity are
dead letters; ``outage``, the batch waits and retries; ``config``, an operator must act."""

REDIS_ERROR_KINDS: dict[str, RedisTrouble] = {
    # about the one key the command names
    "WRONGTYPE": "record",
    # the server is there but cannot answer now
    "LOADING": "outage",
    "BUSY": "outage",
    "MASTERDOWN": "outage",
    "TRYAGAIN": "outage",
    "CLUSTERDOWN": "outage",
    # how this worker is set up against this server
    "NOPERM": "config",
    "NOAUTH": "config",
    "WRONGPASS": "config",
    "CROSSSLOT": "config",
    "MOVED": "config",
    "ASK": "config",
}
"""Error reply codes (the reply's first word) by kind. Any other code, ``ERR`` included
(an unknown or renamed command, wrong arguments), counts as ``config``: a reply nobody
here can explain must not cost records, and readiness shows it word for word."""


def redis_client(settings: RedisSettings) -> RedisClient:
    """A client for the configured Redis, with AUTH/ACL user and TLS CA when set; a
    ``RedisCluster`` with ``cluster``.

    With ``sentinels``, a client of the primary the Sentinels name
    (``worker.features.sentinel``). A plain or Sentinel client connects lazily; a cluster
    client reads the slot map from the seed node at once (FeatureStoreError when it
    cannot). Raises ``ConfigError`` for a URL
    redis-py would misread or refuse; its message and traceback hold no part of the URL,
    which may carry the password (settings built in code have not been through
    ``load_config``'s check).
    """
    from worker.errors import ConfigError

    if settings.sentinels:
        return sentinel_client(settings)
    url = settings.checked_url()
    extra: dict[str, Any] = {}
    if settings.username is not None:
        extra["username"] = settings.username
    if settings.password is not None:
        extra["password"] = settings.password.get_secret_value()
    if settings.ssl_ca_certs is not None:
        extra["ssl_ca_certs"] = str(settings.ssl_ca_certs)
    if settings.cluster:
        return _cluster_client(url, settings, extra)
    try:
        return redis.Redis.from_url(
            url,
            socket_timeout=settings.socket_timeout_s,
            socket_connect_timeout=settings.socket_timeout_s,
            **extra,
        )
    except (ValueError, TypeError):
        pass  # raised below, outside this block, so no exception context can quote the URL
    raise ConfigError(
        "redis.url: redis-py refused its query arguments (?name=value&...): check their "
        "names and values"
    ) from None


def _cluster_client(url: str, settings: RedisSettings, extra: dict[str, Any]) -> RedisCluster:
    problem: str | None = None
    try:
        return RedisCluster.from_url(
            url,
            socket_timeout=settings.socket_timeout_s,
            socket_connect_timeout=settings.socket_timeout_s,
            **extra,
        )
    except (ValueError, TypeError):
        problem = "config"
    except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
        problem = type(exc).__name__
    # raised out here, so no exception context can quote the URL
    if problem == "config":
        from worker.errors import ConfigError

        raise ConfigError(
            "redis.url: redis-py refused its query arguments (?name=value&...): check their "
            "names and values"
        ) from None
    raise FeatureStoreError(
        f"the Redis Cluster seed node in redis.url cannot give its slot map ({problem}); "
        "check that it is up and that redis.cluster = true is meant"
    ) from None


def ping(client: RedisClient) -> None:
    try:
        client.ping()
    except redis.RedisError as exc:
        raise FeatureStoreError(f"Redis is not reachable: {exc}") from exc


def classify_redis_error(exc: redis.RedisError) -> tuple[RedisTrouble, str]:
    """What ``exc`` means for a batch, and its error code (``ERR`` when it names none).

    Refused credentials are ``config``; any other failure to connect, send or read (a
    timeout, LOADING, a garbled reply) is an ``outage``; an error reply is judged by its
    code, ``REDIS_ERROR_KINDS``.
    """
    code = _error_code(exc)
    if isinstance(exc, _CREDENTIAL_ERRORS):
        return "config", code
    if not isinstance(exc, redis.ResponseError):
        return "outage", code
    return REDIS_ERROR_KINDS.get(code, "config"), code


_CREDENTIAL_ERRORS = (
    redis.exceptions.AuthenticationError,
    redis.exceptions.AuthenticationWrongNumberOfArgsError,
)

# For redis-py releases whose errors carry no ``status_code``: the classes it parses
# replies into, most specific first (MovedError is an AskError, MasterDownError a
# ClusterDownError).
_CODE_OF_CLASS: tuple[tuple[type[redis.RedisError], str], ...] = (
    (redis.exceptions.NoPermissionError, "NOPERM"),
    (redis.exceptions.BusyLoadingError, "LOADING"),
    (redis.exceptions.MovedError, "MOVED"),
    (redis.exceptions.AskError, "ASK"),
    (redis.exceptions.TryAgainError, "TRYAGAIN"),
    (redis.exceptions.MasterDownError, "MASTERDOWN"),
    (redis.exceptions.ClusterDownError, "CLUSTERDOWN"),
    (redis.exceptions.ClusterCrossSlotError, "CROSSSLOT"),
)


def _error_code(exc: redis.RedisError) -> str:
    """The reply's code: redis-py keeps it aside for the codes it knows (and strips it
    from the text), leaves it in the text for the others."""
    code = getattr(exc, "status_code", None)
    if isinstance(code, str) and code:
        return code
    for cls, name in _CODE_OF_CLASS:
        if isinstance(exc, cls):
            return name
    if isinstance(exc, redis.exceptions.AuthenticationError):  # three replies, one class
        text = str(exc)
        if "username-password" in text:
            return "WRONGPASS"
        if text.startswith("Authentication required"):
            return "NOAUTH"
    head = str(exc).split(" ", 1)[0]
    return head if head.isalpha() and head.isupper() else "ERR"


def reply_text(exc: redis.RedisError, code: str) -> str:
    """The error as Redis sent it, code first."""
    text = str(exc)
    return text if text.startswith(code) else f"{code} {text}"


@dataclass(frozen=True, slots=True)
class Command:
    """The command a store sends per batch, to name it, and what to grant, in errors."""

    name: str
    pattern: str
    """The ACL key pattern the store's keys fall under, e.g. ``features:*``."""
    user: str
    """The ACL user the client logs in as."""

    @classmethod
    def of(cls, name: str, client: RedisClient, spec: FeatureSpec) -> Command:
        if isinstance(client, RedisCluster):
            kwargs = client.get_connection_kwargs()  # type: ignore[no-untyped-call]
        else:
            kwargs = client.connection_pool.connection_kwargs
        user = kwargs.get("username") or "default"
        return cls(name, spec.key_template.replace("{entity}", "*"), str(user))

    def failed(
        self, exc: redis.RedisError, *, key: str | None = None, outage: str | None = None
    ) -> FeatureStoreError | FeatureStoreConfigError:
        """The error to raise for ``exc``, which concerns the whole batch: ``outage`` (a
        message prefix) when it is one, else what an operator has to change."""
        kind, code = classify_redis_error(exc)
        replied = isinstance(exc, redis.ResponseError) or code != "ERR"  # LOADING, WRONGPASS
        text = reply_text(exc, code) if replied else str(exc)
        if kind == "outage":
            return FeatureStoreError(f"{outage or f'Redis cannot answer {self.name} now'}: {text}")
        where = f" of key {key!r}" if key is not None else ""
        return FeatureStoreConfigError(
            f"Redis refused {self.name}{where}: {text.rstrip('.')}; {self._advice(exc, code)}"
        )

    def _advice(self, exc: redis.RedisError, code: str) -> str:
        if code == "NOPERM":
            return (
                f"the ACL user {self.user!r} needs {self.name} on keys {self.pattern!r}: "
                f"ACL SETUSER {self.user} +{self.name.lower()} ~{self.pattern}"
            )
        if isinstance(exc, _CREDENTIAL_ERRORS) or code in ("NOAUTH", "WRONGPASS"):
            return (
                "set redis.username and redis.password (or the user and password in "
                "redis.url) to credentials this server accepts"
            )
        if code in ("MOVED", "ASK", "CROSSSLOT"):
            return (
                "redis.url names a Redis Cluster node: set redis.cluster = true (keys are "
                "then grouped by the node that owns them), or point redis.url at a "
                "standalone Redis or a proxy that routes keys"
            )
        if "unknown command" in str(exc).lower():
            return f"this server does not accept {self.name} (renamed or disabled?): enable it"
        return "fix the Redis server or the [redis] settings; the worker retries until then"


def round_trip(
    client: redis.Redis, payload: bytes, replies: int, command: Command
) -> tuple[list[Any], dict[int, redis.ResponseError]]:
    """Send pre-encoded RESP commands in one write and read ``replies`` answers (parsed by
    hiredis when installed); an error reply leaves None in its place and is returned by
    position, for the caller to judge. Raises FeatureStoreError when Redis cannot be
    reached or the connection fails, FeatureStoreConfigError when it refuses the login."""
    pool = client.connection_pool
    try:
        conn: Any = pool.get_connection()
    except redis.RedisError as exc:
        raise command.failed(exc, outage="Redis is not reachable") from exc
    answers: list[Any] = []
    errors: dict[int, redis.ResponseError] = {}
    try:
        conn.send_packed_command([payload])
        read, append = conn.read_response, answers.append
        for i in range(replies):
            try:
                append(read())
            except redis.ResponseError as exc:  # one whole reply was read: still in step
                errors[i] = exc
                append(None)
    except redis.RedisError as exc:
        conn.disconnect()
        outage = f"Redis round trip of {replies} {command.name}s failed"
        raise command.failed(exc, outage=outage) from exc
    finally:
        pool.release(conn)
    return answers, errors


def settle(
    command: Command,
    errors: dict[int, redis.ResponseError],
    key_of: Callable[[int], str] | None,
) -> dict[int, str]:
    """Dead-letter reasons, by position, for the replies Redis refused about their own
    key (``key_of`` names it; None when a reply covers several keys). Raises when any
    refusal concerns the whole batch: FeatureStoreConfigError before FeatureStoreError."""
    refused: dict[int, str] = {}
    worst: tuple[RedisTrouble, int] | None = None
    for i, exc in errors.items():
        kind, code = classify_redis_error(exc)
        if kind == "record" and key_of is not None:
            refused[i] = (
                f"Redis refused {command.name} of key {key_of(i)!r}: {reply_text(exc, code)}"
            )
        elif worst is None or worst[0] == "outage":
            worst = (kind, i)
    if worst is not None:
        i = worst[1]
        raise command.failed(errors[i], key=key_of(i) if key_of is not None else None)
    return refused


_SLOT_MOVED = frozenset({"MOVED", "ASK"})


def cluster_round_trip(
    client: RedisCluster, commands: Sequence[bytes], keys: Sequence[bytes], command: Command
) -> tuple[list[Any], dict[int, redis.ResponseError]]:
    """One reply per command, ``commands[i]`` naming the one key ``keys[i]``: each node
    gets one write with its share and every write goes out before any reply is read.
    MOVED or ASK (slots being moved) refreshes the slot map and asks again once; still
    moving, it is an outage the batch waits out. A node that cannot be reached is an
    outage too, after which the slot map is refreshed: when it names other nodes for
    these keys (a dead primary's replica promoted) they are asked at once, else the
    batch waits and its next try asks again. Raises as ``round_trip`` does."""
    try:
        answers, errors = _by_node(client, commands, keys, command)
    except FeatureStoreError:
        owners = _owners(client, keys)
        _refresh_slots(client)
        if _owners(client, keys) == owners:
            raise
        answers, errors = _by_node(client, commands, keys, command)
    if any(_error_code(e) in _SLOT_MOVED for e in errors.values()):
        client.nodes_manager.initialize()
        answers, errors = _by_node(client, commands, keys, command)
        moved = next((e for e in errors.values() if _error_code(e) in _SLOT_MOVED), None)
        if moved is not None:
            raise FeatureStoreError(f"the Redis Cluster is moving slots: {moved}") from moved
    return answers, errors


def _owners(client: RedisCluster, keys: Sequence[bytes]) -> set[str]:
    owner = client.nodes_manager.get_node_from_slot
    return {owner(slot).name for slot in {key_slot(key) for key in keys}}


def _refresh_slots(client: RedisCluster) -> None:
    """Ask the nodes that answer for the slot map again; none answering leaves the old
    one, and the next failed try asks again."""
    with contextlib.suppress(redis.RedisError, redis.exceptions.RedisClusterException):
        client.nodes_manager.initialize()


def _by_node(
    client: RedisCluster, commands: Sequence[bytes], keys: Sequence[bytes], command: Command
) -> tuple[list[Any], dict[int, redis.ResponseError]]:
    owner = client.nodes_manager.get_node_from_slot
    groups: dict[str, tuple[Any, list[int]]] = {}
    for i, key in enumerate(keys):
        node = owner(key_slot(key))
        groups.setdefault(node.name, (node, []))[1].append(i)
    answers: list[Any] = [None] * len(keys)
    errors: dict[int, redis.ResponseError] = {}
    taken: list[tuple[Any, Any, list[int]]] = []
    try:
        for node, positions in groups.values():
            pool = node.redis_connection.connection_pool
            conn = pool.get_connection()
            taken.append((pool, conn, positions))
            conn.send_packed_command([b"".join([commands[i] for i in positions])])
        for _pool, conn, positions in taken:
            read = conn.read_response
            for i in positions:
                try:
                    answers[i] = read()
                except redis.ResponseError as exc:  # one whole reply was read: still in step
                    errors[i] = exc
    except redis.RedisError as exc:
        for _pool, conn, _ in taken:
            conn.disconnect()
        outage = f"Redis Cluster round trip of {len(keys)} {command.name}s failed"
        raise command.failed(exc, outage=outage) from exc
    finally:
        for pool, conn, _ in taken:
            pool.release(conn)
    return answers, errors
