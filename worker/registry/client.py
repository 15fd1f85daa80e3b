"""The Schema Registry client, and what its failures mean for a batch.

A failure is either the registry's (unreachable, slow, 5xx, credentials refused: an
outage the batch waits out, ``SchemaRegistryError``) or the record's (its schema id is
unknown: a dead letter). Nothing else is told apart, so nothing else is guessed at."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from worker.config import SchemaRegistrySettings, WorkerConfig
from worker.errors import ConfigError, SchemaRegistryError

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

__all__ = [
    "NOT_FOUND",
    "is_transport",
    "needs_registry",
    "open_registry",
    "outage",
    "registry_client",
    "status_of",
]

log = logging.getLogger(__name__)

NOT_FOUND = 404


def registry_client(settings: SchemaRegistrySettings) -> SchemaRegistryClient:
    """A client for ``settings``; raises ConfigError naming what the library refused."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    if settings.url is None:
        raise ConfigError("[schema_registry] url is required by a pipeline's request_format")
    try:
        return SchemaRegistryClient(settings.client_conf())
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"[schema_registry]: {exc}") from None


def outage(exc: BaseException, doing: str) -> SchemaRegistryError:
    """The ``SchemaRegistryError`` a failed call means (never a record's fault)."""
    status = status_of(exc)
    if status is not None:
        if status in (401, 403):
            why = f"refuses this worker's credentials (HTTP {status}: {exc})"
        else:
            why = f"answered HTTP {status} ({exc})"
    else:
        why = f"unreachable ({type(exc).__name__}: {exc or 'no detail'})"
    return SchemaRegistryError(f"schema registry {why} while {doing}")


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of a registry client error (confluent-kafka's
    ``SchemaRegistryError``), or None for any other failure."""
    status = getattr(exc, "http_status_code", None)
    return status if isinstance(status, int) and status > 0 else None


def needs_registry(config: WorkerConfig) -> bool:
    """Whether a pipeline reads framed requests or writes Avro results."""
    return any(p.request_format != "json" or p.result_format != "json" for p in config.pipelines)


def open_registry(settings: SchemaRegistrySettings) -> SchemaRegistryClient | None:
    """The client when ``[schema_registry] url`` is set, after one call that shows
    whether the registry answers: credentials it refuses stop the worker (ConfigError,
    exit 2); an unreachable registry is only logged, as batches wait for it anyway."""
    if settings.url is None:
        return None
    client = registry_client(settings)
    try:
        client.get_subjects()
    except Exception as exc:  # the client raises httpx's errors as well as its own
        problem = outage(exc, "listing subjects at start-up")
        if status_of(exc) in (401, 403):
            raise ConfigError(f"[schema_registry]: {problem}") from None
        log.warning("%s; batches that need a schema wait for it", problem)
    return client


def is_transport(exc: BaseException) -> bool:
    """httpx's (or httpx2's) network errors, the registry client's transport, without
    importing it."""
    return any(t.__name__ == "TransportError" for t in type(exc).__mro__)
