"""The lanes benchmark's worker config and report (``benchmarks.lanes``)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np

from benchmarks.lanes import Options, Stack, config_toml, format_report
from streamfer_dev.modelgen import DemoModel
from worker.config import WorkerConfig


def stack(tmp_path: Path) -> Stack:
    fields = [f"f{i}" for i in range(3)]
    light = DemoModel(tmp_path / "light.onnx", fields, np.zeros((1, 3), dtype=np.float32))
    heavy = DemoModel(tmp_path / "heavy.onnx", fields, np.zeros((1, 3), dtype=np.float32))
    return Stack("127.0.0.1:9092", "redis://127.0.0.1:6379/0", tmp_path, light, heavy, "e", 10)


def test_lanes_mode_gives_priorities_and_fifo_mode_none(tmp_path: Path) -> None:
    opts = Options(bulk_batch=128)
    lanes = WorkerConfig.model_validate(
        tomllib.loads(config_toml(stack(tmp_path), "t", "lanes", opts))
    )
    fifo = WorkerConfig.model_validate(
        tomllib.loads(config_toml(stack(tmp_path), "t", "fifo", opts))
    )
    assert [(p.name, p.rank) for p in lanes.pipelines] == [("live", 10), ("bulk", -10)]
    assert [p.rank for p in fifo.pipelines] == [0, 0]
    assert [lanes.in_flight_share(p) for p in lanes.pipelines] == [None, 0.5]
    assert [fifo.in_flight_share(p) for p in fifo.pipelines] == [None, None]
    live, bulk = lanes.pipelines
    assert live.batch.mode == "adaptive" and bulk.batch.max_batch_size == 128
    assert live.model.path.name == "light.onnx" and bulk.model.path.name == "heavy.onnx"
    assert bulk.request_topics == ["t-bulk-requests"] and lanes.kafka.group_id == "t"
    assert lanes.max_in_flight_batches == 4
    wider = tomllib.loads(config_toml(stack(tmp_path), "t", "lanes", Options(max_in_flight=16)))
    assert WorkerConfig.model_validate(wider).in_flight_bound == 16 * 256


def test_the_report_has_a_row_per_run_and_the_medians() -> None:
    row = {
        "run": 1,
        "p50_ms": 40.0,
        "p95_ms": 80.0,
        "p99_ms": 120.0,
        "max_ms": 150.0,
        "bulk_rps": 5000,
        "lost": 0,
        "duplicates": 0,
    }
    report = {
        "options": Options().__dict__,
        "date": "2026-12-01 22:00 UTC",
        "loadavg_1m": [1.0, 2.0],
        "rows": [{**row, "mode": "lanes"}, {**row, "mode": "fifo", "p99_ms": 4000.0}],
        "median": {
            "lanes": {"p50_ms": 40.0, "p99_ms": 120.0, "bulk_rps": 5000},
            "fifo": {"p50_ms": 40.0, "p99_ms": 4000.0, "bulk_rps": 5000},
        },
    }
    text = format_report(report)
    assert "| 1 | lanes | 40.0 | 80.0 | 120.0 | 150.0 | 5000 | 0 | 0 |" in text
    assert "| 1 | fifo | 40.0 | 80.0 | 4000.0 |" in text
    assert "median fifo: p50 40.0 ms, p99 4000.0 ms" in text
