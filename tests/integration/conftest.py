"""Fixtures shared by the integration tests of model versions, canaries and shadows."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from streamfer_dev.harness import WorkerProcess, wait_for_assignment
from streamfer_dev.schema_registry import local_schema_registry
from streamfer_dev.stack import free_port
from tests.conftest import Topics
from tests.integration.recipes import FraudData
from tests.integration.served_mlp import PARTITIONS, config_text
from tests.integration.test_bring_your_own_model import store_features

MlpConfig = Callable[..., tuple[Path, int]]


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[str]:
    """The base URL of a Confluent-compatible Schema Registry (``SchemaRegistryClient``'s
    ``url``): ``SCHEMA_REGISTRY_URL`` if set, else an Apicurio Registry started for the
    session and stopped at its end."""
    with local_schema_registry() as url:
        yield url


@pytest.fixture
def mlp_config(kafka_bootstrap: str, redis_url: str, tmp_path: Path) -> MlpConfig:
    """Factory: store the data's features under a fresh prefix and write a worker config
    serving ``model_path`` from them (``served_mlp.config_text``); returns its path and
    metrics port."""

    def write(
        topics: Topics,
        data: FraudData,
        model_path: Path | None,
        *,
        model_lines: str = "",
        pipeline_extra: str = "",
    ) -> tuple[Path, int]:
        tag = f"mlp-{uuid.uuid4().hex[:8]}"
        store_features(redis_url, tag, data)
        port = free_port()
        config = tmp_path / "worker.toml"
        config.write_text(
            config_text(
                bootstrap=kafka_bootstrap,
                redis_url=redis_url,
                topics=topics,
                tag=tag,
                model_path=model_path,
                metrics_port=port,
                model_lines=model_lines,
                pipeline_extra=pipeline_extra,
            )
        )
        return config, port

    return write


@pytest.fixture
def mlp_worker(
    mlp_config: MlpConfig, tmp_path: Path
) -> Iterator[Callable[..., tuple[WorkerProcess, int]]]:
    """Factory: ``mlp_config``, then a worker started from it (``args``: ``--processes
    2``, say); without ``args``, waits until it owns every partition. Returns it and its
    metrics port; stops it after the test."""
    started: list[WorkerProcess] = []

    def start(
        topics: Topics,
        data: FraudData,
        model_path: Path | None,
        *,
        args: tuple[str, ...] = (),
        **config: str,
    ) -> tuple[WorkerProcess, int]:
        path, port = mlp_config(topics, data, model_path, **config)
        worker = WorkerProcess(path, tmp_path / "worker.log", args=args).start()
        started.append(worker)
        if not args:
            wait_for_assignment([worker], PARTITIONS, timeout=90)
        return worker, port

    yield start
    for worker in started:
        worker.terminate()
