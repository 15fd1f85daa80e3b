"""Both Redis feature layouts end to end: load with ``streamfer features load``, serve."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from streamfer_dev.harness import collect_outcomes, produce_requests
from streamfer_dev.modelgen import DemoModel
from tests.conftest import Topics
from tests.integration.helpers import streamfer

pytestmark = pytest.mark.integration


def _write_csv(path: Path, model: DemoModel, prefix: str) -> list[str]:
    ids = [f"{prefix}{i}" for i in range(len(model.features))]
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["entity", *model.fields])
        for entity, row in zip(ids, model.features.tolist(), strict=True):
            writer.writerow([entity, *map(repr, row)])
    return ids


def test_packed_and_hash_layouts_give_the_same_predictions(
    kafka_bootstrap: str,
    redis_url: str,
    model: DemoModel,
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    csv_path = tmp_path / "features.csv"
    ids = _write_csv(csv_path, model, "lay-")
    scores: dict[str, dict[str, list[float]]] = {}
    for layout in ("hash", "packed"):
        t = fresh_topics(2)
        config = write_config(
            t, name=f"{layout}.toml", layout=layout, key_template=f"{layout}:{{entity}}"
        )
        loaded = streamfer(
            "features",
            "load",
            "--config",
            str(config),
            "--file",
            str(csv_path),
            "--no-progress",
            timeout=180,
        )
        assert loaded.returncode == 0, loaded.stderr
        assert f"loaded {len(ids)} entities ({layout})" in loaded.stdout
        requests = {f"{layout}-{e}": e for e in ids[:200]}
        produce_requests(
            kafka_bootstrap,
            t.requests,
            [
                (rid, e.encode(), f'{{"id": "{rid}", "entity": "{e}"}}'.encode())
                for rid, e in requests.items()
            ],
        )
        run = streamfer("run", "--config", str(config), "--burst-idle-s", "3", timeout=180)
        assert run.returncode == 0, run.stderr[-2000:]
        out = collect_outcomes(
            kafka_bootstrap, t.results, t.dead_letters, set(requests), timeout=30, keep_docs=True
        )
        assert out.lost(set(requests)) == []
        scores[layout] = {requests[d["id"]]: d["outputs"]["scores"] for d in out.result_docs}
    client = redis.Redis.from_url(redis_url)
    stored = client.get(f"packed:{ids[3]}")
    client.close()
    assert stored is not None and len(stored) == 4 * len(model.fields)
    np.testing.assert_allclose(np.frombuffer(stored, "<f4"), model.features[3], rtol=1e-6)
    assert scores["hash"] == scores["packed"]


def test_parquet_load_writes_hashes_and_bad_values_are_named(
    redis_url: str,
    model: DemoModel,
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    config = write_config(fresh_topics(1), key_template="pq:{entity}")
    table = {"entity": [f"pq-{i}" for i in range(50)]}
    for j, name in enumerate(model.fields):
        table[name] = model.features[:50, j].astype(float).tolist()
    pq.write_table(pa.table(table), tmp_path / "f.parquet")
    loaded = streamfer(
        "features",
        "load",
        "--config",
        str(config),
        "--file",
        str(tmp_path / "f.parquet"),
        "--no-progress",
        timeout=180,
    )
    assert loaded.returncode == 0, loaded.stderr
    client = redis.Redis.from_url(redis_url)
    value = client.hget("pq:pq-7", "f2")
    client.close()
    assert value is not None and float(value) == pytest.approx(float(model.features[7, 2]))

    bad = tmp_path / "bad.csv"
    bad.write_text("entity," + ",".join(model.fields) + "\nx," + ",".join(["1"] * 29) + ",oops\n")
    refused = streamfer(
        "features",
        "load",
        "--config",
        str(config),
        "--file",
        str(bad),
        "--no-progress",
        timeout=180,
    )
    assert refused.returncode == 2
    assert "line 2, column 'f29'" in refused.stderr
