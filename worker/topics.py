"""Creating the topics a pipeline needs, idempotently, with the admin client."""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from worker.errors import StackError

__all__ = ["ensure_topics"]


def ensure_topics(
    bootstrap_servers: str,
    topics: Iterable[tuple[str, int]],
    *,
    options: dict[str, str | int | float] | None = None,
    timeout: float = 30.0,
) -> None:
    """Create ``(name, partitions)`` topics that do not exist yet."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, **(options or {})})
    new = [NewTopic(name, num_partitions=n, replication_factor=1) for name, n in topics]
    if not new:
        return
    for name, future in admin.create_topics(new, operation_timeout=timeout).items():
        try:
            future.result(timeout)
        except KafkaException as exc:
            err = exc.args[0]
            if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise StackError(f"cannot create topic {name!r}: {exc}") from exc
