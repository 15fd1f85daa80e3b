"""Redis Sentinel: the primary of ``[redis] service_name`` as the Sentinels name it.

``sentinel_client`` is a ``redis.Redis`` whose pool asks the Sentinels for the primary's
address whenever it opens a connection, so after a failover (the primary gone, a replica
promoted) the next connection goes to the new primary. Until the Sentinels have promoted
one, connecting fails like any Redis outage and the batch waits (``store_wait``). A
connection left on a primary that came back as a replica reads READONLY, which redis-py
turns into a connection error: the same wait, then the new primary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis
from pydantic import SecretStr
from redis.sentinel import Sentinel

from worker.config import RedisSettings
from worker.errors import ConfigError

__all__ = ["sentinel_client", "sentinel_primary"]


def _service(settings: RedisSettings) -> str:
    if not settings.sentinels or settings.service_name is None:
        raise ConfigError("redis.sentinels and redis.service_name are both needed for Sentinel")
    return settings.service_name


def _signed_in(
    username: str | None, password: SecretStr | None, tls: bool, ca: Path | None
) -> dict[str, Any]:
    """redis-py keywords for one side's credentials and TLS."""
    kwargs: dict[str, Any] = {}
    if username is not None:
        kwargs["username"] = username
    if password is not None:
        kwargs["password"] = password.get_secret_value()
    if tls:
        kwargs["ssl"] = True
        if ca is not None:
            kwargs["ssl_ca_certs"] = str(ca)
    return kwargs


def _sentinels(settings: RedisSettings) -> Sentinel:
    timeout = settings.socket_timeout_s
    asking = _signed_in(
        settings.sentinel_username,
        settings.sentinel_password,
        settings.sentinel_tls,
        settings.ssl_ca_certs,
    )
    asking.update(socket_timeout=timeout, socket_connect_timeout=timeout)
    return Sentinel(settings.sentinel_addresses(), sentinel_kwargs=asking)


def sentinel_client(settings: RedisSettings) -> redis.Redis:
    """A client of the current primary; connects lazily, so Sentinels that are down at
    start-up fail the first round trip (an outage), not this call."""
    primary = _signed_in(settings.username, settings.password, settings.tls, settings.ssl_ca_certs)
    timeout = settings.socket_timeout_s
    primary.update(db=settings.database, socket_timeout=timeout, socket_connect_timeout=timeout)
    client: redis.Redis = _sentinels(settings).master_for(_service(settings), **primary)
    return client


def sentinel_primary(settings: RedisSettings) -> tuple[str, int]:
    """The (host, port) the Sentinels name as the primary now. Raises
    ``redis.sentinel.MasterNotFoundError`` (a ``redis.ConnectionError``) naming each
    Sentinel's answer when none names a healthy one."""
    host, port = _sentinels(settings).discover_master(_service(settings))
    return str(host), int(port)
