"""Metrics declared per unit: each unit's ``Families`` builds only its own families, the
worker's ``Metrics`` builds every unit's on one registry under the names dashboards use,
and no family is declared by two units."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter

from worker.cache import CacheFamilies
from worker.compose import Metrics
from worker.delivery import DeliveryFamilies
from worker.loop import LoopFamilies
from worker.models import ModelFamilies
from worker.ops import METRIC_NAMES, Families, OpsFamilies, counter
from worker.pipeline import PipelineFamilies

UNITS: list[type[Families]] = [
    OpsFamilies,
    CacheFamilies,
    PipelineFamilies,
    ModelFamilies,
    DeliveryFamilies,
    LoopFamilies,
]


def exported(registry: CollectorRegistry) -> set[str]:
    """Family names as METRIC_NAMES writes them (counters with ``_total``)."""
    names = set()
    for family in registry.collect():
        names.add(f"{family.name}_total" if family.type == "counter" else family.name)
    return names


def test_the_worker_exports_every_unit_family_on_one_registry() -> None:
    registry = CollectorRegistry()
    Metrics(registry)
    assert exported(registry) == set(METRIC_NAMES)


def test_each_unit_builds_only_its_own_families_and_no_two_share_one() -> None:
    seen: dict[str, str] = {}
    for unit in UNITS:
        registry = CollectorRegistry()
        unit(registry)
        for name in exported(registry):
            assert name not in seen, f"{name}: declared by {seen[name]} and {unit.__name__}"
            seen[name] = unit.__name__
    assert set(seen) == set(METRIC_NAMES)


def test_a_part_handed_the_worker_metrics_updates_the_one_registry() -> None:
    metrics = Metrics()
    delivery: DeliveryFamilies = metrics
    delivery.commits.inc(2)
    pipeline: PipelineFamilies = metrics
    pipeline.for_pipeline("fraud").records.inc(3)
    assert metrics.registry.get_sample_value("streamfer_commits_total") == 2
    got = metrics.registry.get_sample_value("streamfer_records_total", {"pipeline": "fraud"})
    assert got == 3


def test_a_family_declared_twice_under_one_name_is_refused() -> None:
    class Mine(Families):
        commits = counter("streamfer_my_commits", "Mine")

    class Both(Mine, DeliveryFamilies):
        pass

    with pytest.raises(TypeError, match="commits is declared twice"):
        Both()


def test_a_declared_family_is_a_plain_prometheus_metric_once_built() -> None:
    metrics = DeliveryFamilies()
    assert isinstance(metrics.commits, Counter)
    assert "commits" in vars(metrics)  # read without the descriptor on the hot path
