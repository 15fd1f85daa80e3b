"""A share group's own configuration on the broker, read and set at start-up.

A share group keeps what a consumer group's members would configure themselves as group
configs on the broker (KIP-932): where a partition the group has not started yet begins
(``share.auto.offset.reset``, ``latest`` unless set), how often a record may be
delivered before it is archived (``share.delivery.count.limit``) and how long a
member holds a delivered record (``share.record.lock.duration.ms``). ``prepare``
makes the start follow ``[kafka] auto_offset_reset`` and reads the other two, which
the share loop lives by: the last allowed delivery becomes a dead letter, and a poll
must be finished well within the lock. ``describe`` is what ``streamfer check`` shows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from worker.config import KafkaSettings
from worker.errors import ConfigError
from worker.kafka.admin import admin_client

__all__ = [
    "DEFAULT_DELIVERY_COUNT_LIMIT",
    "DEFAULT_RECORD_LOCK_S",
    "ShareGroupSettings",
    "describe_share_group",
    "prepare_share_group",
]

log = logging.getLogger(__name__)

DEFAULT_DELIVERY_COUNT_LIMIT = 5
"""Apache Kafka's ``group.share.delivery.count.limit``."""
DEFAULT_RECORD_LOCK_S = 30.0
"""Apache Kafka's ``group.share.record.lock.duration.ms``, in seconds."""

_RESET = "share.auto.offset.reset"
_LIMIT = "share.delivery.count.limit"
_LOCK = "share.record.lock.duration.ms"


@dataclass(frozen=True, slots=True)
class ShareGroupSettings:
    """What the share loop lives by, as the group's configuration says."""

    delivery_count_limit: int
    """Deliveries after which the broker archives a record."""
    record_lock_s: float
    """How long a member holds a record it was given."""


def describe_share_group(
    settings: KafkaSettings, *, timeout: float = 10.0, admin: Any = None
) -> dict[str, str]:
    """The group's ``share.*`` configs (every group has them, defaults included, once the
    broker serves share groups). Raises KafkaException when the broker refuses or does
    not answer, ConfigError when it answers without them (no share groups there)."""
    admin = admin if admin is not None else admin_client(settings)
    group = settings.group_id
    resource = ConfigResource(ResourceType.GROUP, group)
    found = admin.describe_configs([resource], request_timeout=timeout)[resource].result()
    shared = {name: entry.value for name, entry in found.items() if name.startswith("share.")}
    if _RESET not in shared:
        raise ConfigError(
            f"[kafka] share_group = true: the broker knows no share group config for "
            f"group {group!r}: it does not serve share groups (Apache Kafka 4.2+ with the "
            "share.version feature enabled)"
        )
    return shared


def prepare_share_group(
    settings: KafkaSettings, *, timeout: float = 10.0, admin: Any = None
) -> ShareGroupSettings:
    """Make the group start where ``auto_offset_reset`` says and read its limits.

    The start matters only for partitions the group has not begun yet. Where the group
    cannot be described or altered (the worker's user lacks DESCRIBE_CONFIGS or
    ALTER_CONFIGS on the group), a group that would start at ``latest`` while
    ``earliest`` is asked for is a ConfigError, since it would skip what was written
    before its first member polled; ``latest`` asked of an ``earliest`` group only warns.
    The limits then fall back to ``share_delivery_count_limit`` (or Kafka's defaults),
    with a warning."""
    admin = admin if admin is not None else admin_client(settings)
    group, wanted = settings.group_id, settings.auto_offset_reset
    try:
        shared: dict[str, str] | None = describe_share_group(settings, timeout=timeout, admin=admin)
    except KafkaException as exc:
        log.warning("cannot describe share group %s's configuration: %s", group, exc)
        shared = None
    if shared is None or shared.get(_RESET) != wanted:
        _set_start(admin, settings, timeout, current=None if shared is None else shared[_RESET])
    return _limits(settings, shared)


def _set_start(admin: Any, settings: KafkaSettings, timeout: float, current: str | None) -> None:
    group, wanted = settings.group_id, settings.auto_offset_reset
    resource = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[
            ConfigEntry(_RESET, wanted, incremental_operation=AlterConfigOpType.SET)
        ],
    )
    try:
        admin.incremental_alter_configs([resource], request_timeout=timeout)[resource].result()
    except KafkaException as exc:
        how = (
            f"kafka-configs.sh --alter --entity-type groups --entity-name {group} "
            f"--add-config {_RESET}={wanted}"
        )
        if wanted == "earliest" and current != "earliest":
            raise ConfigError(
                f'[kafka] auto_offset_reset = "earliest": cannot set share group {group}\'s '
                f"{_RESET} ({exc}); the group would start new partitions at the latest "
                f"offset and skip what is there. Allow this user ALTER_CONFIGS on the group, "
                f"or set it once ({how}) and allow DESCRIBE_CONFIGS"
            ) from None
        log.warning(
            "cannot set share group %s's %s to %s (%s); it stays %s (set it with: %s)",
            group,
            _RESET,
            wanted,
            exc,
            current or "unknown",
            how,
        )
        return
    log.info("share group %s: %s = %s (was %s)", group, _RESET, wanted, current or "unknown")


def _limits(settings: KafkaSettings, shared: dict[str, str] | None) -> ShareGroupSettings:
    given = settings.share_delivery_count_limit
    if shared is None:
        limit = given or DEFAULT_DELIVERY_COUNT_LIMIT
        log.warning(
            "share group %s: assuming a delivery limit of %d and a record lock of %gs "
            "(its configuration could not be read%s)",
            settings.group_id,
            limit,
            DEFAULT_RECORD_LOCK_S,
            "" if given else "; set [kafka] share_delivery_count_limit if it differs",
        )
        return ShareGroupSettings(limit, DEFAULT_RECORD_LOCK_S)
    lock_s = int(shared.get(_LOCK, DEFAULT_RECORD_LOCK_S * 1000)) / 1000.0
    reported = shared.get(_LIMIT)
    if reported is None:  # described, but silent on the limit: what the user gave stands
        return ShareGroupSettings(given or DEFAULT_DELIVERY_COUNT_LIMIT, lock_s)
    limit = int(reported)
    if given is not None and given != limit:
        log.warning(
            "[kafka] share_delivery_count_limit = %d, but share group %s's %s is %d: "
            "using the group's",
            given,
            settings.group_id,
            _LIMIT,
            limit,
        )
    return ShareGroupSettings(limit, lock_s)
