"""The Schema Registry client, and what its failures mean for a batch.

A failure is either the registry's (unreachable, slow, 5xx, credentials refused, an HTTP
404 that is not the registry's own answer: an outage the batch waits out,
``SchemaRegistryError``) or the record's (the registry says its schema id is unknown: a
dead letter). A 404 is the registry's "not found" only when its body carries the
registry's error code for it (404xx); any other 404 comes from something in front of the
registry's API (a base path missing from the URL, a proxy's page), which at start-up
stops the worker. Nothing else is told apart, so nothing else is guessed at."""

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
    "not_found",
    "open_registry",
    "outage",
    "registry_client",
    "start_refusal",
    "status_of",
]

log = logging.getLogger(__name__)

NOT_FOUND = 404
_NOT_FOUND_CODES = range(40400, 40500)
"""The registry's own error codes for "not found" (40401 subject, 40402 version, 40403
schema, ...), sent in the body of its HTTP 404."""


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
    hint = ""
    if status is not None:
        if status in (401, 403):
            why = f"refuses this worker's credentials (HTTP {status}: {exc})"
        elif status == NOT_FOUND and not not_found(exc):
            said = getattr(exc, "error_message", None)
            why = "answered HTTP 404 without a Schema Registry error code" + (
                f" ({said})" if said else " or message"
            )
            hint = (
                ": the URL is not a registry's API; is its base path missing (Apicurio's "
                "is /apis/ccompat/v7)?"
            )
        else:
            why = f"answered HTTP {status} ({exc})"
    else:
        why = f"unreachable ({type(exc).__name__}: {exc or 'no detail'})"
    return SchemaRegistryError(f"schema registry {why} while {doing}{hint}")


def not_found(exc: BaseException) -> bool:
    """Whether ``exc`` is the registry's own answer that what was asked for does not
    exist: HTTP 404 with a 404xx error code in its body."""
    code = getattr(exc, "error_code", None)
    return status_of(exc) == NOT_FOUND and isinstance(code, int) and code in _NOT_FOUND_CODES


def start_refusal(settings: SchemaRegistrySettings, exc: BaseException) -> str | None:
    """Why no worker can use the registry at ``settings.url``, from the failure to list
    its subjects: it refuses the credentials, or it answers 404 (listing subjects never
    does at a registry's API). None for a failure that may pass (an outage)."""
    if status_of(exc) not in (401, 403, NOT_FOUND):
        return None
    return f"[schema_registry] url = {settings.url}: {outage(exc, 'listing subjects')}"


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
    whether the registry answers: credentials it refuses or a URL that is not a
    registry's API stop the worker (ConfigError, exit 2); an unreachable registry is only
    logged, as batches wait for it anyway."""
    if settings.url is None:
        return None
    client = registry_client(settings)
    try:
        client.get_subjects()
    except Exception as exc:  # the client raises httpx's errors as well as its own
        refusal = start_refusal(settings, exc)
        if refusal is not None:
            raise ConfigError(refusal) from None
        problem = outage(exc, "listing subjects at start-up")
        log.warning("%s; batches that need a schema wait for it", problem)
    return client


def is_transport(exc: BaseException) -> bool:
    """httpx's (or httpx2's) network errors, the registry client's transport, without
    importing it."""
    return any(t.__name__ == "TransportError" for t in type(exc).__mro__)
