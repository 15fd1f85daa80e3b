"""The Kafka admin client, configured the one way every command needs it.

Topic creation, record limits, group state and replay's output topics all talk to the
cluster through an ``AdminClient`` that must carry the user's client options (security
settings, SASL credentials) exactly as the consumer and producer do; building it here
keeps a new option from reaching some of them only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from worker.config import KafkaSettings
from worker.kafka.client_logs import KAFKA_LOG

__all__ = ["COORDINATOR_SETTLING", "COORDINATOR_WAIT_S", "admin_client", "coordinator_settling"]


def admin_client(
    settings: KafkaSettings,
    *,
    logger: logging.Logger | None = None,
    on_error: Callable[[KafkaError], None] | None = None,
) -> AdminClient:
    """An admin client for ``settings``' cluster; librdkafka's own log lines go to
    ``logger`` (``KAFKA_LOG`` unless given), client errors (a refused login, say) to
    ``on_error`` when given. Connects lazily: nothing blocks here."""
    conf: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "logger": logger if logger is not None else KAFKA_LOG,
    }
    if on_error is not None:
        conf["error_cb"] = on_error
    return AdminClient({**conf, **settings.client_options()})


COORDINATOR_SETTLING = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
    }
)
"""Answers of a group coordinator that is moving or still loading (a new group on a
fresh cluster gets them for its first seconds): asked again, it answers."""

COORDINATOR_WAIT_S = 30.0


def coordinator_settling(exc: KafkaException) -> bool:
    """Whether ``exc`` is one of ``COORDINATOR_SETTLING``: worth asking again."""
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and err.code() in COORDINATOR_SETTLING
