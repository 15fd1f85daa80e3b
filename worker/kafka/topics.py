"""Creating topics that do not exist yet, idempotently, with the admin client."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from worker.errors import StackError, StreamferError

__all__ = ["create_missing", "ensure_topics"]


def ensure_topics(
    bootstrap_servers: str,
    topics: Iterable[tuple[str, int]],
    *,
    options: dict[str, str | int | float] | None = None,
    timeout: float = 30.0,
    replication_factor: int = 1,
) -> None:
    """Create ``(name, partitions)`` topics that do not exist yet, with
    ``replication_factor`` replicas each (-1: the cluster's default). Raises
    ``StackError``."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, **(options or {})})
    new = [
        NewTopic(name, num_partitions=n, replication_factor=replication_factor)
        for name, n in topics
    ]
    create_missing(admin, new, timeout=timeout)


def create_missing(
    admin: AdminClient,
    topics: Sequence[NewTopic],
    *,
    timeout: float = 30.0,
    error: type[StreamferError] = StackError,
    logger: logging.Logger | None = None,
) -> None:
    """Create ``topics``; one that exists already is left as it is. Blocks up to
    ``timeout`` seconds per topic; says on ``logger`` (when given) which it created.
    Raises ``error`` naming the first topic the cluster refused."""
    if not topics:
        return
    for name, future in admin.create_topics(list(topics), operation_timeout=timeout).items():
        try:
            future.result(timeout)
        except KafkaException as exc:
            err = exc.args[0]
            if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise error(f"cannot create topic {name!r}: {exc}") from exc
        if logger is not None:
            logger.info("created topic %s", name)
