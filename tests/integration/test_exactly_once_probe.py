"""The exactly-once start-up probe where the cluster is not the test's own: a probe topic
of the user's choosing, the probe switched off, and a probe topic that cannot be made."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from streamfer_dev.harness import end_offsets
from tests.conftest import Topics
from tests.integration.helpers import streamfer

pytestmark = pytest.mark.integration

EXACTLY_ONCE = 'delivery = "exactly-once"\n'


def _run(path: Path) -> tuple[int, str]:
    proc = streamfer("run", "--config", str(path), "--burst-idle-s", "2", timeout=180)
    return proc.returncode, proc.stderr


def test_the_probe_runs_on_the_topic_the_config_names(
    kafka_bootstrap: str, fresh_topics: Callable[..., Topics], write_config: Callable[..., Path]
) -> None:
    probe = f"probe-{uuid.uuid4().hex[:8]}"
    top = f'{EXACTLY_ONCE}exactly_once_probe_topic = "{probe}"\n'
    path = write_config(fresh_topics(1), top=top)
    code, stderr = _run(path)
    assert code == 0, stderr[-3000:]
    assert sum(end_offsets(kafka_bootstrap, probe).values()) >= 2  # aborted and committed


def test_the_probe_can_be_switched_off_with_a_warning(
    fresh_topics: Callable[..., Topics], write_config: Callable[..., Path]
) -> None:
    path = write_config(fresh_topics(1), top=f"{EXACTLY_ONCE}exactly_once_probe = false\n")
    code, stderr = _run(path)
    assert code == 0, stderr[-3000:]
    assert "exactly_once_probe = false: starting without proof" in stderr


def test_a_probe_topic_the_cluster_refuses_names_the_ways_out(
    fresh_topics: Callable[..., Topics], write_config: Callable[..., Path]
) -> None:
    bad = "no such/topic"  # the broker refuses to create it, as one without CREATE would
    top = f'{EXACTLY_ONCE}exactly_once_probe_topic = "{bad}"\n'
    path = write_config(fresh_topics(1), top=top)
    code, stderr = _run(path)
    assert code == 2, stderr[-3000:]
    assert f"on the topic '{bad}', which is missing and could not be created" in stderr
    assert "exactly_once_probe_topic" in stderr and "exactly_once_probe = false" in stderr
