"""The Kafka admin client, configured the one way every command needs it.

Topic creation, record limits, group state and replay's output topics all talk to the
cluster through an ``AdminClient`` that must carry the user's client options (security
settings, SASL credentials) exactly as the consumer and producer do; building it here
keeps a new option from reaching some of them only.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka.admin import AdminClient

from worker.config import KafkaSettings
from worker.kafka_logs import KAFKA_LOG

__all__ = ["admin_client"]


def admin_client(settings: KafkaSettings, *, logger: logging.Logger | None = None) -> AdminClient:
    """An admin client for ``settings``' cluster; librdkafka's own log lines go to
    ``logger`` (``KAFKA_LOG`` unless given). Connects lazily: nothing blocks here."""
    conf: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "logger": logger if logger is not None else KAFKA_LOG,
    }
    return AdminClient({**conf, **settings.client_options()})
