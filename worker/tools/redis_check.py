"""``streamfer check``'s Redis Sentinel line: which server the Sentinels name as the
primary of ``service_name`` now, so an operator sees where lookups go before a worker
starts (the pipeline check then reads a probe key there)."""

from __future__ import annotations

import redis

from worker.config import RedisSettings
from worker.features import sentinel_primary
from worker.tools.kafka_check import CheckLine

__all__ = ["check_sentinel"]


def check_sentinel(settings: RedisSettings) -> list[CheckLine]:
    """One line with ``sentinels``, none without."""
    if not settings.sentinels:
        return []
    asked = ", ".join(settings.sentinels)
    try:
        host, port = sentinel_primary(settings)
    except redis.RedisError as exc:
        return [
            CheckLine(
                "redis sentinel",
                False,
                f"no Sentinel of {asked} names a primary for service "
                f"{settings.service_name!r}: {exc}",
            )
        ]
    return [
        CheckLine(
            "redis sentinel",
            True,
            f"service {settings.service_name!r}: primary {host}:{port} (asked {asked})",
        )
    ]
