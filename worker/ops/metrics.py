"""How a unit declares its Prometheus metrics, on an injected ``CollectorRegistry``.

Each unit declares the families it updates beside the code that updates them, in a
``Families`` subclass of its own (``worker/<unit>/metrics.py``): one class attribute per
family, made with ``counter``, ``gauge`` or ``histogram``. Building the class builds every
family it declares on the registry given; nothing is registered at import time, so tests
can build many workers in one process. A class that inherits several units' families
builds all of them on one registry: that is how ``worker.compose.Metrics`` makes what a
worker exports, and it can be handed to any unit that takes one of them.

Label children are resolved once per pipeline, never per record, and no label ever
carries a record key or id. The ``ops`` unit's own family is ``streamfer_ready``.
``METRIC_NAMES`` lists every exported family; dashboards and alerts may only use these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

__all__ = [
    "METRIC_NAMES",
    "SECONDS_BUCKETS",
    "Declared",
    "Families",
    "OpsFamilies",
    "counter",
    "gauge",
    "histogram",
]

SECONDS_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
)
"""The buckets of every family that times a batch, so their quantiles line up."""

M = TypeVar("M", bound=MetricWrapperBase)


class Declared(Generic[M]):
    """One family a unit declares: a class attribute of its ``Families``. Building the
    class puts the family, made on its registry, in the instance's ``__dict__``, which
    hides this descriptor: reading a metric costs a plain attribute look-up."""

    __slots__ = ("_make", "name")

    def __init__(self, make: Callable[[CollectorRegistry], M]) -> None:
        self._make = make
        self.name = ""

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.name = name

    def build(self, registry: CollectorRegistry) -> M:
        return self._make(registry)

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> Declared[M]: ...

    @overload
    def __get__(self, instance: object, owner: type[Any]) -> M: ...

    def __get__(self, instance: object | None, owner: type[Any]) -> Declared[M] | M:
        if instance is None:
            return self
        raise AttributeError(f"{self.name} is built by Families.__init__, which did not run")


def counter(name: str, documentation: str, *labels: str) -> Declared[Counter]:
    """A counter family (exported as ``<name>_total``) labelled by ``labels``."""
    return Declared(lambda r: Counter(name, documentation, labels, registry=r))


def gauge(name: str, documentation: str, *labels: str) -> Declared[Gauge]:
    """A gauge family labelled by ``labels``."""
    return Declared(lambda r: Gauge(name, documentation, labels, registry=r))


def histogram(
    name: str,
    documentation: str,
    *labels: str,
    buckets: tuple[float, ...] = SECONDS_BUCKETS,
) -> Declared[Histogram]:
    """A histogram family labelled by ``labels``; ``buckets`` default to seconds."""
    return Declared(lambda r: Histogram(name, documentation, labels, buckets=buckets, registry=r))


class Families:
    """The families declared by this class and its bases, built on one registry (a new
    one by default). A family declared twice under one name is refused, as the registry
    refuses one name registered twice."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        for name, declared in _declared(type(self)).items():
            self.__dict__[name] = declared.build(self.registry)


def _declared(cls: type[Families]) -> dict[str, Declared[Any]]:
    found: dict[str, Declared[Any]] = {}
    for klass in cls.__mro__:
        for name, value in vars(klass).items():
            if not isinstance(value, Declared):
                continue
            if name in found:
                raise TypeError(f"{cls.__name__}: the metric {name} is declared twice")
            found[name] = value
    return found


class OpsFamilies(Families):
    """What the ``ops`` unit exports: the worker's readiness, as its health reads it."""

    ready = gauge("streamfer_ready", "1 when the worker is ready")


METRIC_NAMES = (
    "streamfer_records_total",
    "streamfer_results_total",
    "streamfer_dead_letters_total",
    "streamfer_batches_total",
    "streamfer_batch_size",
    "streamfer_stage_seconds",
    "streamfer_end_to_end_seconds",
    "streamfer_feature_lookups_total",
    "streamfer_feature_store_errors_total",
    "streamfer_schema_registry_errors_total",
    "streamfer_model_info",
    "streamfer_inference_provider",
    "streamfer_model_reloads_total",
    "streamfer_model_failed_batches_total",
    "streamfer_model_paused",
    "streamfer_canary_records_total",
    "streamfer_shadow_batches_total",
    "streamfer_shadow_label_agreement",
    "streamfer_shadow_score_abs_diff",
    "streamfer_shadow_seconds",
    "streamfer_device_oom_retries_total",
    "streamfer_triton_call_seconds",
    "streamfer_triton_errors_total",
    "streamfer_stage_wait_seconds",
    "streamfer_aged_batches_total",
    "streamfer_pipeline_priority",
    "streamfer_in_flight_records",
    "streamfer_in_flight_share_held",
    "streamfer_in_flight_batches",
    "streamfer_paused_partitions",
    "streamfer_assigned_partitions",
    "streamfer_consumer_lag",
    "streamfer_seconds_to_drain",
    "streamfer_ready",
    "streamfer_commits_total",
    "streamfer_commit_failures_total",
    "streamfer_rebalances_total",
    "streamfer_group_rejoins_total",
    "streamfer_share_acknowledged_records_total",
    "streamfer_share_redeliveries_total",
    "streamfer_share_lock_overruns_total",
    "streamfer_share_acknowledgement_errors_total",
    "streamfer_cache_hits_total",
    "streamfer_cache_misses_total",
    "streamfer_cache_evictions_total",
    "streamfer_cache_entries",
    "streamfer_cache_bytes",
    "streamfer_cache_hit_ratio",
    "streamfer_cache_errors_total",
)
