"""Where the worker's Kafka cluster and its Redis feature store are, and how it signs in
to each: ``[kafka]`` and ``[redis]``. Credentials are secrets that never print; a
password file is read in at start-up by ``worker.config.loading``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator

from worker.config.base import Frozen
from worker.config.redis_url import redis_url_problem, sentinel_address_problem, split_address
from worker.errors import ConfigError

__all__ = [
    "BROKER_SIDE_UNDER_CONSUMER",
    "BROKER_SIDE_UNDER_SHARE",
    "Assignor",
    "GroupProtocol",
    "KafkaSettings",
    "LibrdkafkaValue",
    "RedisSettings",
]

LibrdkafkaValue = str | int | float | bool

GroupProtocol = Literal["classic", "consumer"]

Assignor = Literal["cooperative-sticky", "roundrobin", "range"]

BROKER_SIDE_UNDER_CONSUMER = {
    "session.timeout.ms": "group.consumer.session.timeout.ms",
    "heartbeat.interval.ms": "group.consumer.heartbeat.interval.ms",
    "partition.assignment.strategy": "group.consumer.assignors (or the client's "
    "group.remote.assignor)",
}
"""librdkafka settings the consumer group protocol (KIP-848) moves to the broker, each
with the broker setting that replaces it; librdkafka refuses them under that protocol."""

BROKER_SIDE_UNDER_SHARE = {
    "session.timeout.ms": "share.session.timeout.ms",
    "heartbeat.interval.ms": "share.heartbeat.interval.ms",
    "partition.assignment.strategy": "group.share.assignors",
    "auto.offset.reset": "share.auto.offset.reset, which the worker sets from "
    "[kafka] auto_offset_reset",
    "group.instance.id": "nothing: share groups have no static membership",
}
"""librdkafka settings a share group (KIP-932) takes from the group's configuration on
the broker instead, each with the group config (or broker setting) that replaces it."""

_SET_BY_THE_SHARE_WORKER = {
    "share.acknowledgement.mode": "explicit, so that nothing is accepted before delivery",
    "max.poll.records": "from the in-flight bound, max_in_flight_batches x max_batch_size",
}
"""Share consumer settings the at-least-once promise rests on; a raw option must not
override them."""

_SENTINEL_ONLY = (
    "service_name",
    "database",
    "tls",
    "sentinel_username",
    "sentinel_password",
    "sentinel_password_file",
    "sentinel_tls",
)
"""``[redis]`` settings that mean something only with ``sentinels``."""

_TYPED = {
    "session_timeout_ms": "session.timeout.ms",
    "heartbeat_interval_ms": "heartbeat.interval.ms",
    "assignor": "partition.assignment.strategy",
}


class KafkaSettings(Frozen):
    """Where the cluster is and how this worker joins its group.

    ``options`` go to both consumer and producer verbatim (security settings, for
    example); ``consumer_options`` and ``producer_options`` to one of them.
    """

    bootstrap_servers: str = Field(
        default="127.0.0.1:9092",
        description="The brokers to connect to first, host:port separated by commas.",
    )
    group_id: str = Field(
        default="streamfer",
        description="The consumer group (or share group) the workers of this config form.",
    )
    group_protocol: GroupProtocol = Field(
        default="classic",
        description=(
            "`consumer`: KIP-848's group protocol (Apache Kafka 4.0+): the broker "
            "assigns the partitions and a rebalance moves only what changes, "
            "without stopping the group. Its session timeout, heartbeat interval "
            "and assignor are then the broker's settings."
        ),
    )
    assignor: Assignor = Field(
        default="cooperative-sticky",
        description=(
            "How the classic protocol spreads partitions. `cooperative-sticky`: a "
            "join moves only the partitions it must, in two rounds, and librdkafka "
            "holds the second round until a second after the first, so the moved "
            "partitions wait about a second. `roundrobin` or `range`: one round in "
            "which every member hands back all its partitions and gets its share "
            "again, a pause of tens of milliseconds for all. Every member of a group "
            "must offer the same one: change it for the whole group at once (a "
            "member with another is refused until none is left)."
        ),
    )
    auto_offset_reset: Literal["earliest", "latest", "error"] = Field(
        default="earliest",
        description=(
            "Where a partition the group has never committed starts: the log start "
            "(earliest), the log end at assignment, committed at once (latest), or "
            "a refusal to start (error)."
        ),
    )
    session_timeout_ms: int = Field(
        default=45000,
        ge=1000,
        le=3_600_000,
        description=(
            "How long the broker waits for a silent member before rebalancing its "
            "partitions (classic protocol only; the broker's "
            "group.consumer.session.timeout.ms otherwise)."
        ),
    )
    heartbeat_interval_ms: int = Field(
        default=1000,
        ge=100,
        le=3_600_000,
        description=(
            "How soon a member that is fetching hears of a rebalance (one that owns "
            "nothing hears about once a second whatever this is). Under "
            "cooperative-sticky a join takes two rounds: librdkafka's default of 3 s "
            "made a replica added under load wait up to 6 s for its partitions."
        ),
    )
    max_poll_interval_ms: int = Field(
        default=300_000,
        ge=1000,
        description=(
            "librdkafka's max.poll.interval.ms; a batch running longer than a "
            "quarter of it pauses its partitions while the loop keeps polling."
        ),
    )
    group_instance_id: str | None = Field(
        default=None,
        description=(
            "Static membership: a stable id per worker (a StatefulSet pod name) so "
            "a restart costs no rebalance and, in exactly-once mode, fences the old"
            " producer at once."
        ),
    )
    share_group: bool = Field(
        default=False,
        description=(
            "Consume as a member of the share group `group_id` (KIP-932, Apache "
            "Kafka 4.2+) instead of a consumer group: the broker hands the records "
            "of one partition to every member, each acknowledged one by one, so "
            "more workers than partitions all work. At-least-once only; results are"
            " not in partition order (`worker.loop.share_group`)."
        ),
    )
    share_delivery_count_limit: int | None = Field(
        default=None,
        ge=2,
        le=10,
        description=(
            "With `share_group`: the group's `share.delivery.count.limit`, the "
            "deliveries after which the broker archives a record. None reads it "
            "from the group's configuration at start-up; give it where the worker "
            "may not describe the group's configuration (the broker's default is "
            "5). A record on its last delivery becomes a `redelivered` dead letter "
            "before it is processed."
        ),
    )
    group_coverage_check_s: float = Field(
        default=10.0,
        ge=0,
        description=(
            "With `group_instance_id`: how often to look for partitions no member "
            "of the settled group owns (`worker.kafka.group_coverage`); 0 never "
            "looks."
        ),
    )
    options: dict[str, LibrdkafkaValue] = Field(
        default_factory=dict,
        description=(
            "librdkafka options for every client (consumer, producer, admin, check,"
            " replay, offsets): security settings, for example. Secrets among them "
            "are masked when printed."
        ),
    )
    consumer_options: dict[str, LibrdkafkaValue] = Field(
        default_factory=dict, description="librdkafka options for the consumer only."
    )
    producer_options: dict[str, LibrdkafkaValue] = Field(
        default_factory=dict, description="librdkafka options for the producer only."
    )
    sasl_username: str | None = Field(
        default=None, description="SASL user name; the mechanism and protocol go in options."
    )
    sasl_password: SecretStr | None = Field(
        default=None,
        description="SASL password (a secret, never printed); prefer sasl_password_file.",
    )
    sasl_password_file: Path | None = Field(
        default=None,
        description=("Read at start-up into `sasl_password` (a mounted Kubernetes secret, say)."),
    )

    @model_validator(mode="after")
    def _protocol_settings(self) -> KafkaSettings:
        """Under ``consumer`` the settings that moved to the broker are refused wherever
        they come from, each with what replaces it; ``group.protocol`` itself is this
        field, never a raw option."""
        for where in ("options", "consumer_options"):
            raw = getattr(self, where).get("group.protocol")
            if raw is not None:
                raise ValueError(
                    f"{where} sets group.protocol = {raw!r}: set [kafka] group_protocol "
                    f'= "{raw}" instead, so every part of the worker knows the protocol'
                )
        if self.group_protocol != "consumer":
            return self
        moved = [
            (f"[kafka] {field}", _TYPED[field])
            for field in _TYPED
            if field in self.model_fields_set
        ]
        moved += [
            (f"{where} {name!r}", name)
            for where in ("options", "consumer_options")
            for name in getattr(self, where)
            if name in BROKER_SIDE_UNDER_CONSUMER
        ]
        if moved:
            raise ValueError(
                'group_protocol = "consumer" moves these settings to the broker; remove '
                + "; ".join(
                    f"{given} (the broker's {BROKER_SIDE_UNDER_CONSUMER[name]})"
                    for given, name in moved
                )
            )
        return self

    @model_validator(mode="after")
    def _share_group_settings(self) -> KafkaSettings:
        """A share group takes its membership from the broker and has no offsets: what a
        consumer group would use is refused, each with what replaces it, never ignored."""
        if not self.share_group:
            if "share_delivery_count_limit" in self.model_fields_set:
                raise ValueError("share_delivery_count_limit is for share_group = true only")
            return self
        refused = []
        if self.group_protocol == "consumer":
            refused.append(
                'group_protocol = "consumer" (a share group has a protocol of its own: remove it)'
            )
        if self.group_instance_id:
            refused.append("group_instance_id (share groups have no static membership)")
        if self.auto_offset_reset == "error":
            refused.append(
                'auto_offset_reset = "error" (a share group starts at the earliest or the '
                "latest offset: share.auto.offset.reset)"
            )
        refused += [
            f"[kafka] {field} (the group's {BROKER_SIDE_UNDER_SHARE[_TYPED[field]]})"
            for field in _TYPED
            if field in self.model_fields_set
        ]
        refused += [
            f"{where} {name!r} (the group's {BROKER_SIDE_UNDER_SHARE[name]})"
            for where in ("options", "consumer_options")
            for name in getattr(self, where)
            if name in BROKER_SIDE_UNDER_SHARE
        ]
        refused += [
            f"{where} {name!r} (the worker sets it: {why})"
            for where in ("options", "consumer_options")
            for name in getattr(self, where)
            if (why := _SET_BY_THE_SHARE_WORKER.get(name)) is not None
        ]
        if refused:
            raise ValueError("share_group = true cannot use " + "; ".join(refused))
        return self

    @model_validator(mode="after")
    def _heartbeat_within_session(self) -> KafkaSettings:
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError(
                f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be less than "
                f"session_timeout_ms ({self.session_timeout_ms})"
            )
        return self

    def client_options(self) -> dict[str, LibrdkafkaValue]:
        """``options`` plus the SASL credentials, for both clients."""
        merged = dict(self.options)
        if self.sasl_username is not None:
            merged["sasl.username"] = self.sasl_username
        if self.sasl_password is not None:
            merged["sasl.password"] = self.sasl_password.get_secret_value()
        return merged


class RedisSettings(Frozen):
    """The feature store. The URL may carry a password, so it is a secret; use
    ``rediss://`` for TLS (``ssl_ca_certs`` to trust a private CA) and ``username`` /
    ``password`` (or ``password_file``) for AUTH and ACL users. With ``sentinels`` the
    Sentinels name the primary instead of ``url`` (``worker.features.sentinel``)."""

    url: SecretStr = Field(
        default=SecretStr("redis://127.0.0.1:6379/0"),
        description=(
            "The feature store: redis:// or rediss:// (TLS). A secret, never "
            "printed; a password with / # ? must be percent-encoded or go in "
            "password."
        ),
    )
    url_file: Path | None = Field(
        default=None, description="A file read at start-up into url (a mounted secret, say)."
    )
    username: str | None = Field(
        default=None,
        description=(
            "The ACL user; it needs +hmget (hash) or +mget (packed; +get on a "
            "cluster) on the key pattern."
        ),
    )
    password: SecretStr | None = Field(
        default=None, description="The password (a secret, never printed); prefer password_file."
    )
    password_file: Path | None = Field(
        default=None, description="A file read at start-up into password."
    )
    ssl_ca_certs: Path | None = Field(
        default=None,
        description=(
            "The CA bundle for a rediss:// server signed by a private CA; omit for public CAs."
        ),
    )
    socket_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description=(
            "How long one Redis round trip may take; a slower one counts as an "
            "outage and the batch waits and retries."
        ),
    )
    cluster: bool = Field(
        default=False,
        description=(
            "`url` is a seed node of a Redis Cluster: each batch's keys go to the "
            "nodes that own their slots, one pipelined write per node, all sent "
            "before any reply is read."
        ),
    )
    sentinels: list[str] = Field(
        default_factory=list,
        description='Redis Sentinel addresses, "host:port" each: the worker asks them which '
        "server is the primary of service_name and asks again after a failover. Replaces url.",
    )
    service_name: str | None = Field(
        default=None,
        description="With sentinels: the name the Sentinels monitor the primary under "
        "(the name in sentinel monitor <name> ...).",
    )
    database: int = Field(
        default=0,
        ge=0,
        description="With sentinels: the database number on the primary (plain Redis takes "
        "it from url).",
    )
    tls: bool = Field(
        default=False,
        description="With sentinels: talk TLS to the primary, trusting ssl_ca_certs (plain "
        "Redis says rediss:// in url).",
    )
    sentinel_username: str | None = Field(
        default=None, description="ACL user the worker signs in to the Sentinels as."
    )
    sentinel_password: SecretStr | None = Field(
        default=None, description="Password of the Sentinels (requirepass or the ACL user's)."
    )
    sentinel_password_file: Path | None = Field(
        default=None, description="Read at start-up into sentinel_password."
    )
    sentinel_tls: bool = Field(
        default=False, description="Talk TLS to the Sentinels, trusting ssl_ca_certs."
    )

    @model_validator(mode="after")
    def _sentinel_settings(self) -> RedisSettings:
        """Sentinel mode is all or nothing: its settings without ``sentinels`` (or a
        ``url`` beside them) would be silently ignored, so each is refused by name."""
        if not self.sentinels:
            given = [name for name in _SENTINEL_ONLY if name in self.model_fields_set]
            if given:
                raise ValueError(f"{', '.join(given)}: only with redis.sentinels")
            return self
        problems = [p for a in self.sentinels if (p := sentinel_address_problem(a))]
        if self.service_name is None or not self.service_name.strip():
            problems.append("service_name is required with sentinels")
        if self.cluster:
            problems.append("cluster = true cannot go with sentinels (a Cluster fails over itself)")
        for name in ("url", "url_file"):
            if name in self.model_fields_set:
                problems.append(
                    f"{name}: the Sentinels name the primary; remove it (database, tls, "
                    "username and password say the rest)"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """``sentinels`` as (host, port) pairs, as validated."""
        return [split_address(a) for a in self.sentinels]

    def checked_url(self, source: str | None = None) -> str:
        """The URL, once it is known that redis-py reads it as written. Raises
        ``ConfigError`` naming the field and the fix, with no part of the URL in it."""
        url = self.url.get_secret_value()
        problem = redis_url_problem(url)
        if problem is None:
            return url
        field = "redis.url" if self.url_file is None else "redis.url (read from redis.url_file)"
        where = f"{source}: " if source else ""
        raise ConfigError(
            f"{where}{field}: cannot be used as written: {problem}. Percent-encode the user "
            "name and password in the URL (urllib.parse.quote(password, safe='')), or leave "
            "them out of it and set redis.username and redis.password or "
            "redis.password_file"
        ) from None
