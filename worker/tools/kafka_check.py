"""The Kafka half of ``streamfer check``: what a worker needs from the cluster, asked
before it runs.

Each check is one line: the cluster answers (metadata within the timeout); every
request, result and dead-letter topic exists; the consumer group can be described (the
credentials may read it), or for a share group (``[kafka] share_group``) its
configuration, which says the broker serves share groups and where the group starts;
and the producer can start: in exactly-once mode its
transactions initialise (under a transactional id of its own, so a running worker is
never fenced), otherwise it connects with the worker's producer settings. A check whose
prerequisite failed is not run: one line says why the cluster is unusable.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from worker.config import WorkerConfig
from worker.core import Deadline
from worker.errors import ConfigError
from worker.kafka import (
    admin_client,
    coordinator_settling,
    describe_share_group,
    producer_config,
    transactional_id,
)

__all__ = ["CheckLine", "check_kafka"]

log = logging.getLogger(__name__)
_quiet = logging.getLogger(f"{__name__}.librdkafka")
_quiet.setLevel(logging.CRITICAL)
"""librdkafka repeats a connection error many times a second; the check's own line
says it once."""


@dataclass(frozen=True, slots=True)
class CheckLine:
    """One check: what was checked, whether it passed, and what was found."""

    name: str
    ok: bool
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        return f"{'ok' if self.ok else 'FAIL'}: {self.name}: {self.detail}"


def check_kafka(config: WorkerConfig, timeout: float = 10.0) -> list[CheckLine]:
    """Run every Kafka check; the lines come back in order, failures included."""
    settings = config.kafka
    errors: list[KafkaError] = []
    admin = admin_client(settings, logger=_quiet, on_error=errors.append)
    try:
        meta = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        # the client's own errors say more than the call's (a refused login, a
        # certificate the CA did not sign): the last one of them, if any
        admin.poll(0.1)  # serves them
        why = errors[-1].str() if errors else _reason(exc)
        return [
            CheckLine(
                "kafka",
                False,
                f"{settings.bootstrap_servers} did not answer within {timeout:g}s "
                f"({why}); check bootstrap_servers, the network and the security options",
            )
        ]
    lines = [
        CheckLine(
            "kafka",
            True,
            f"{settings.bootstrap_servers}: {len(meta.brokers)} brokers, cluster {meta.cluster_id}",
        )
    ]
    for role, topic in _topics(config):
        found = meta.topics.get(topic)
        error = None if found is None else found.error
        if found is None or error is not None:
            why = "does not exist" if error is None else error.str()
            lines.append(CheckLine(f"topic {topic}", False, f"{role}: {why}"))
        else:
            lines.append(
                CheckLine(f"topic {topic}", True, f"{role}, {len(found.partitions)} partitions")
            )
    if settings.share_group:
        lines.append(_check_share_group(config, admin, timeout))
    else:
        lines.append(_check_group(admin.describe_consumer_groups, settings.group_id, timeout))
    lines.append(_check_producer(config, timeout))
    return lines


def _topics(config: WorkerConfig) -> list[tuple[str, str]]:
    out: dict[str, str] = {}
    for p in config.pipelines:
        for topic in p.request_topics:
            out.setdefault(topic, f"request topic of {p.name}")
        out.setdefault(p.result_topic, f"result topic of {p.name}")
        out.setdefault(p.dead_letter_topic, f"dead-letter topic of {p.name}")
    return [(role, topic) for topic, role in out.items()]


def _check_group(describe: Callable[..., Any], group: str, timeout: float) -> CheckLine:
    """Describe the group; a coordinator still loading (a fresh cluster) is asked again
    within ``timeout``."""
    name = f"group {group}"
    deadline = Deadline.after(timeout)
    while True:
        try:
            found = describe([group], request_timeout=timeout)[group].result()
            break
        except KafkaException as exc:
            if not coordinator_settling(exc) or deadline.passed():
                return CheckLine(name, False, f"cannot be described: {_reason(exc)}")
            time.sleep(0.5)
    state = getattr(found.state, "name", str(found.state)).lower()
    kind = getattr(found.type, "name", str(found.type)).lower()
    protocol = f"{kind} protocol, " if kind in ("classic", "consumer") else ""
    return CheckLine(name, True, f"{state}, {protocol}{len(found.members)} members")


def _check_share_group(config: WorkerConfig, admin: Any, timeout: float) -> CheckLine:
    """A share group has no members to describe with the consumer-group API: its
    configuration says the broker serves share groups, and how the group behaves."""
    settings = config.kafka
    name = f"share group {settings.group_id}"
    try:
        found = describe_share_group(settings, timeout=timeout, admin=admin)
    except KafkaException as exc:
        return CheckLine(name, False, f"its configuration cannot be described: {_reason(exc)}")
    except ConfigError as exc:
        return CheckLine(name, False, str(exc))
    start = found.get("share.auto.offset.reset", "latest")
    wanted = settings.auto_offset_reset
    moved = "" if start == wanted else f" (the worker sets {wanted} at start-up)"
    return CheckLine(
        name,
        True,
        f"starts at {start}{moved}, delivery limit {found.get('share.delivery.count.limit')}, "
        f"record lock {found.get('share.record.lock.duration.ms')} ms",
    )


def _check_producer(config: WorkerConfig, timeout: float) -> CheckLine:
    settings = config.kafka
    conf = producer_config(settings)
    conf["logger"] = _quiet
    exactly_once = config.delivery == "exactly-once"
    if exactly_once:
        conf["transactional.id"] = f"{transactional_id(settings)}-check-{uuid.uuid4().hex[:6]}"
        conf.pop("linger.ms", None)
    producer = Producer(conf)
    try:
        if exactly_once:
            producer.init_transactions(timeout)
            return CheckLine("producer", True, "transactions initialise")
        producer.list_topics(config.pipelines[0].result_topic, timeout=timeout)
        return CheckLine("producer", True, "connects with the producer settings")
    except KafkaException as exc:
        what = "transactions do not initialise" if exactly_once else "cannot connect"
        return CheckLine("producer", False, f"{what}: {_reason(exc)}")
    finally:
        producer.flush(0)


def _reason(exc: KafkaException) -> str:
    """The error's text, with its name when the text alone says little."""
    err = exc.args[0] if exc.args else None
    if not isinstance(err, KafkaError):
        return str(exc)
    text = err.str()
    return text if len(text.rstrip(": ")) > 24 else f"{err.name()} ({text.rstrip(': ')})"
