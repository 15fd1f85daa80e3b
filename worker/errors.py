"""The one error tree of streamfer.

Every failure a worker can meet is one of these, so callers can tell what to do by
type alone: retry, or stop without committing. A bad record raises none of them: the
stage that refuses it returns why, and it becomes a dead letter.

    StreamferError
    ├── ConfigError            bad configuration, found at start-up; names the field
    │   ├── FeatureStoreConfigError  Redis refuses how it is used (ACL, AUTH, cluster)
    │   └── ModelMismatchError       the config does not fit the model's inputs
    ├── SourceError            the consumer failed (fatal Kafka error)
    │   └── MemberFenced       the group fenced this static member; the worker starts
    │                          again in place and joins as that member anew
    ├── FeatureStoreError      the feature store is unreachable or answered nonsense
    ├── SchemaRegistryError    the Schema Registry is unreachable or refuses the worker
    ├── EngineError            the model could not be loaded or run
    ├── InferenceServerError   the inference server is down, overloaded or not serving
    ├── SinkError              a result or dead letter was not acknowledged
    │   └── ProducerUnusable   the transactional producer cannot go on (fenced, fatal);
    │                          the worker starts again in place with a new one
    ├── CommitError            an offset commit failed
    ├── CallStalled            a Kafka client call outlived its own timeout; that client is
    │                          beyond use, so the worker starts again in place
    └── StackError             a local service (Kafka, Redis, Tansu) did not start

Only ``FeatureStoreError``, ``SchemaRegistryError`` and ``InferenceServerError`` are
worth retrying in place (the batch waits for Redis, the registry or the server); the
others stop the worker, and what it had not committed is consumed again.
"""

from __future__ import annotations

__all__ = [
    "CallStalled",
    "CommitError",
    "ConfigError",
    "EngineError",
    "FeatureStoreConfigError",
    "FeatureStoreError",
    "InferenceServerError",
    "MemberFenced",
    "ModelMismatchError",
    "ProducerUnusable",
    "SchemaRegistryError",
    "SinkError",
    "SourceError",
    "StackError",
    "StreamferError",
]


class StreamferError(Exception):
    """Base of every error streamfer raises on purpose."""


class ConfigError(StreamferError):
    """Configuration is invalid; the message names the field and what is allowed."""


class FeatureStoreConfigError(ConfigError):
    """Redis refuses the worker's commands for a reason only an operator can fix: the ACL
    user lacks a command or key pattern, the credentials are wrong, or the URL names a
    cluster node. The message says what to change.

    At start-up it stops the worker (exit code 2). At run time it is no fault of any
    record, so the batch waits and is retried, with readiness false and this message as
    the reason, rather than being dead-lettered or stopping the worker (the next worker
    would meet the same refusal).
    """


class ModelMismatchError(ConfigError):
    """The pipeline's config does not fit its model: an input it names or misses, a
    width, a type the worker cannot feed, a string feature a packed lookup cannot hold.
    Found when the model loads; exit code 2, like any configuration error."""


class SourceError(StreamferError):
    """The Kafka consumer reported a fatal error."""


class MemberFenced(SourceError):
    """The group fenced this consumer as a static member (``group_instance_id``). After a
    session timeout librdkafka drops its member id and heartbeats without it, and the
    coordinator fences it for that: the "other member" is the worker itself
    (confluentinc/librdkafka issue 3437), as after a coordinator's broker died. The
    consumer is beyond use, so ``streamfer run`` starts again in place
    (``worker.ops.recovery``) and joins as the same member, from the committed offsets."""


class FeatureStoreError(StreamferError):
    """The feature store could not be reached or answered unusable data."""


class SchemaRegistryError(StreamferError):
    """The Schema Registry could not be reached, timed out, failed (5xx) or refused the
    worker's credentials while a batch needed a writer's schema. No record is at fault:
    the batch waits and is retried, like a feature store outage."""


class EngineError(StreamferError):
    """A model could not be loaded, warmed up or run."""


class InferenceServerError(StreamferError):
    """The inference server that runs a pipeline's model (Triton) cannot answer: it is
    unreachable, past the call's timeout, overloaded, or not serving the model. No record
    is at fault: the batch waits and is retried, like a feature store outage; only the
    model refusing the batch (an ``EngineError``) takes the per-row path."""


class SinkError(StreamferError):
    """A produced record was not acknowledged by the broker; never commit past it."""


class ProducerUnusable(SinkError):
    """The transactional producer cannot go on: fenced (an outage past
    ``transaction.timeout.ms`` has the coordinator abort the transaction and bump the
    epoch), a fatal error, or a transaction it cannot begin or abort. Nothing it held
    was committed; ``streamfer run`` starts again in place (``worker.ops.recovery``)
    with a new producer, from the committed offsets."""


class CommitError(StreamferError):
    """Committing offsets failed."""


class CallStalled(StreamferError):
    """A blocking librdkafka call (a transactional one) did not return within its own
    timeout plus a margin. It cannot be cancelled, so its client is beyond use: the worker
    stops at once, without closing its clients, and ``streamfer run`` starts itself again
    in place (``worker.ops.recovery``); its new transactional producer fences the stuck one."""


class StackError(StreamferError):
    """A local service of the development stack did not start or stop."""
